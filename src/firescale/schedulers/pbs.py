"""PBS and Torque (with Moab-style extensions): #PBS directives; qsub, qstat and qdel."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..site import format_walltime
from .base import COMPLETED, FAILED, GONE, PENDING, RUNNING, TIMEOUT, JobState, Scheduler

if TYPE_CHECKING:
    from ..render import JobSpec
    from ..site import SiteProfile


class PBS(Scheduler):
    name = "pbs"
    template = "pbs.sh.j2"
    hosts_command = 'if [ -n "${PBS_NODEFILE:-}" ] && [ -r "$PBS_NODEFILE" ]; then sort -u "$PBS_NODEFILE"; else hostname; fi'
    job_id_variable = "PBS_JOBID"

    def directives(self, site: "SiteProfile", job: "JobSpec") -> list[str]:
        c = site.config
        nodes = f"nodes={site.nodes_for(job.ranks)}"
        if c["pbs"]["ppn"]:
            nodes += f":ppn={c['node']['cores']}"
        if c["pbs"]["gpus"] and site.device_kind == "gpu":
            nodes += f":gpus={site.gpus_per_node}"
        signal = c["walltime_signal"]
        lines = [
            f"#PBS -N {job.name[:15]}",  # Torque truncates job names at 15 characters
            f"#PBS -l {nodes}",
            f"#PBS -l walltime={format_walltime(job.walltime_s)}",
            # Moab's extension: a signal before walltime ends, so training can snapshot.
            f"#PBS -l signal={signal['signal']}@{signal['seconds_before']}",
            "#PBS -j oe",
            f"#PBS -o {job.log_file}",
        ]
        if c.get("account"):
            lines.append(f"#PBS -A {c['account']}")
        if c.get("queue"):
            lines.append(f"#PBS -q {c['queue']}")
        return lines + [f"#PBS {extra}" for extra in c["directives"]]


    def submit(self, script: Path, workdir: Path) -> str:
        # qsub's exit code only says the script was accepted; the outcome comes from polling and status.json.
        proc = self._run(["qsub", "-d", str(workdir), str(script)] if self.name == "torque"
                         else ["qsub", str(script)], "qsub")
        return proc.stdout.strip().splitlines()[-1].strip()

    def poll(self, job_id: str) -> JobState:
        proc = self.runner(["qstat", "-f", job_id])
        if proc.returncode != 0 or "job_state" not in proc.stdout:
            # PBS Pro keeps finished jobs in the history (-x); Torque keeps them as C for a while.
            proc = self.runner(["qstat", "-x", "-f", job_id])
            if proc.returncode != 0 or "job_state" not in proc.stdout:
                return JobState(GONE, "unknown to qstat")
        return parse_qstat_f(proc.stdout)

    def cancel(self, job_id: str) -> None:
        self.runner(["qdel", job_id])


# Torque's exit_status for a job killed at its walltime (JOB_EXEC_KILL_WALLTIME).
_TORQUE_WALLTIME = -11
_PBS_STATES = {"Q": PENDING, "H": PENDING, "W": PENDING, "T": PENDING, "S": PENDING, "B": RUNNING,
               "R": RUNNING, "E": RUNNING}


def parse_qstat_f(text: str) -> JobState:
    """The state of the job described by `qstat -f` output (Torque or PBS Pro)."""
    fields = dict(re.findall(r"^\s*(\w+)\s*=\s*(.*?)\s*$", text, re.M))
    raw = fields.get("job_state", "?")
    exit_text = fields.get("exit_status") or fields.get("Exit_status")
    exit_code = int(exit_text) if exit_text and exit_text.lstrip("-").isdigit() else None
    if raw in _PBS_STATES:
        return JobState(_PBS_STATES[raw], raw, exit_code)
    if raw in ("C", "F", "X"):
        if exit_code == _TORQUE_WALLTIME:
            return JobState(TIMEOUT, raw, exit_code)
        return JobState(COMPLETED if exit_code == 0 else FAILED, raw, exit_code)
    return JobState(FAILED, raw, exit_code)


class Torque(PBS):
    name = "torque"
