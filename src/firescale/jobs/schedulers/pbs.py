"""PBS Pro (OpenPBS) and Torque with Moab: #PBS directives; qsub, qstat and qdel; each one's exit statuses.

The two differ where it matters here.  PBS Pro asks for nodes with `-l select=` chunks, keeps finished
jobs in its history (`qstat -x`), has no request for a signal before walltime (the job script sets that
timer itself) and reports a walltime kill as Exit_status -29.  Torque asks with `-l nodes=...:ppn=`, keeps
a finished job as state C for a while (its `qstat -x` means XML), takes Moab's `-l signal=SIG@SECONDS`,
and reports a walltime kill as -11 (Torque 6).  Both report a job killed by signal N as 256 + N.
"""
from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from firescale.cluster.site import format_walltime
from firescale.errors import FirescaleError
from firescale.jobs.schedulers.base import (
    COMPLETED,
    FAILED,
    GONE,
    OUT_OF_MEMORY,
    PENDING,
    RUNNING,
    TIMEOUT,
    UNKNOWN,
    JobState,
    Scheduler,
    last_line,
    says,
)

if TYPE_CHECKING:
    from firescale.cluster.site import SiteProfile
    from firescale.jobs.spec import JobSpec

# qstat's answer when the server does not hold the job (Torque: after keep_completed; PBS Pro: finished).
_NOT_HELD = ("Unknown Job Id", "Job has finished")
_STATES = {"Q": PENDING, "H": PENDING, "W": PENDING, "T": PENDING, "S": PENDING, "U": PENDING, "M": PENDING,
           "B": RUNNING, "R": RUNNING, "E": RUNNING}
_ENDED = ("C", "F", "X")


class PBS(Scheduler):
    """PBS Pro / OpenPBS."""

    name = "pbs"
    template = "pbs.sh.j2"
    hosts_command = ('if [ -n "${PBS_NODEFILE:-}" ] && [ -r "$PBS_NODEFILE" ]; '
                     'then sort -u "$PBS_NODEFILE"; else hostname; fi')
    job_id_variable = "PBS_JOBID"
    # Exit_status values the MoM sets itself (OpenPBS src/include/job.h, JOB_EXEC_*): (our state, meaning).
    exec_codes = {-29: (TIMEOUT, "killed at its walltime (JOB_EXEC_KILL_WALLTIME)"),
                  -27: (OUT_OF_MEMORY, "killed for exceeding its memory (JOB_EXEC_KILL_MEM)"),
                  -26: (OUT_OF_MEMORY, "killed for exceeding its virtual memory (JOB_EXEC_KILL_VMEM)"),
                  -28: (FAILED, "killed for exceeding its CPU time (JOB_EXEC_KILL_CPUT)"),
                  -25: (FAILED, "killed for exceeding its CPUs (JOB_EXEC_KILL_NCPUS_SUM)"),
                  -24: (FAILED, "killed for a burst over its CPUs (JOB_EXEC_KILL_NCPUS_BURST)")}
    name_length = 236

    def resource_lines(self, site: SiteProfile, job: JobSpec) -> list[str]:
        placement = site.placement(job.ranks, job.devices_per_rank)
        chunk = f"select={placement.nodes}"
        if site.config["pbs"]["ppn"]:
            chunk += f":ncpus={site.config['node']['cores']}"
        chunk += f":mpiprocs={placement.ranks_per_node}"
        if site.config["pbs"]["gpus"] and site.device_kind == "gpu":
            chunk += f":ngpus={site.gpus_per_node}"
        return [f"#PBS -l {chunk}", "#PBS -l place=scatter", f"#PBS -l walltime={format_walltime(job.walltime_s)}"]

    def directives(self, site: SiteProfile, job: JobSpec) -> list[str]:
        c = site.config
        lines = [f"#PBS -N {job.name[:self.name_length]}", *self.resource_lines(site, job),
                 "#PBS -j oe", f"#PBS -o {job.log_file}"]
        if c.get("account"):
            lines.append(f"#PBS -A {c['account']}")
        if c.get("queue"):
            lines.append(f"#PBS -q {c['queue']}")
        return lines + [f"#PBS {extra}" for extra in c["directives"]]

    def walltime_timer(self, site: SiteProfile, job: JobSpec) -> int | None:
        return max(1, job.walltime_s - site.walltime_signal(job.framework)[1])

    def submit_with(self, script: Path, workdir: Path, env: Mapping[str, str]) -> str:
        # qsub's exit code only says the script was accepted; the outcome comes from polling and status.json.
        # The job sees qsub's environment as PBS_O_* variables, and all of it with `#PBS -V`.
        proc = self._run(self.submit_argv(script, workdir), "qsub", env)
        return proc.stdout.strip().splitlines()[-1].strip()

    def submit_argv(self, script: Path, workdir: Path) -> list[str]:
        return ["qsub", str(script)]  # the job script changes to its run folder itself

    def poll(self, job_id: str) -> JobState:
        proc = self.runner(["qstat", "-f", job_id])
        if proc.returncode == 0 and "job_state" in proc.stdout:
            return self.parse_qstat_f(proc.stdout)
        if not says(proc, *_NOT_HELD):
            return JobState(UNKNOWN, f"qstat failed: {last_line(proc)}")
        return self.finished_state(job_id)

    def finished_state(self, job_id: str) -> JobState:
        """A job qstat no longer lists: PBS Pro's history (`qstat -x -f`)."""
        proc = self.runner(["qstat", "-x", "-f", job_id])
        if proc.returncode == 0 and "job_state" in proc.stdout:
            return self.parse_qstat_f(proc.stdout)
        if says(proc, "Unknown Job Id"):
            return JobState(GONE, "unknown to qstat and to its history (qstat -x)")
        return JobState(UNKNOWN, f"qstat -x failed: {last_line(proc)}")

    def parse_qstat_f(self, text: str) -> JobState:
        """The state of the job described by `qstat -f` output."""
        fields = dict(re.findall(r"^\s*(\w+)\s*=\s*(.*?)\s*$", text, re.M))
        raw = fields.get("job_state", "?")
        exit_text = fields.get("exit_status") or fields.get("Exit_status")
        code = int(exit_text) if exit_text and exit_text.lstrip("-").isdigit() else None
        if raw in _STATES:
            return JobState(_STATES[raw], raw, code)
        if raw not in _ENDED or code is None:
            return JobState(FAILED, raw, code)
        state, meaning = self.exit_meaning(code)
        return JobState(state, f"{raw}, exit status {code}" + (f": {meaning}" if meaning else ""), code)

    def exit_meaning(self, code: int) -> tuple[str, str]:
        """Our state and the words for a finished job's exit status."""
        if code == 0:
            return COMPLETED, ""
        if code in self.exec_codes:
            return self.exec_codes[code]
        if code < 0:
            return FAILED, "the job did not run to its end (a JOB_EXEC_* code of the MoM)"
        if code > 256:
            try:
                return FAILED, f"killed by SIG{signal.Signals(code - 256).name.removeprefix('SIG')}"
            except ValueError:
                return FAILED, f"killed by signal {code - 256}"
        return FAILED, ""

    def cancel(self, job_id: str) -> None:
        proc = self.runner(["qdel", job_id])
        if proc.returncode != 0 and not says(proc, *_NOT_HELD, "Request invalid for state of job"):
            raise FirescaleError(f"qdel failed (qdel {job_id}): {last_line(proc)}")


class Torque(PBS):
    """Torque with the Moab scheduler (Moab reads `-l signal=`)."""

    name = "torque"
    exec_codes = {-11: (TIMEOUT, "killed at its walltime (JOB_EXEC_OVERLIMIT_WT)"),
                  -10: (OUT_OF_MEMORY, "killed over a resource limit, memory on Torque 6 (JOB_EXEC_OVERLIMIT_MEM)"),
                  -12: (FAILED, "killed for exceeding its CPU time (JOB_EXEC_OVERLIMIT_CPUT)")}
    name_length = 15  # Torque truncates job names at 15 characters

    def resource_lines(self, site: SiteProfile, job: JobSpec) -> list[str]:
        nodes = f"nodes={site.nodes_for(job.ranks, job.devices_per_rank)}"
        if site.config["pbs"]["ppn"]:
            nodes += f":ppn={site.config['node']['cores']}"
        if site.config["pbs"]["gpus"] and site.device_kind == "gpu":
            nodes += f":gpus={site.gpus_per_node}"
        sig, lead = site.walltime_signal(job.framework)
        # Moab's extension: a signal before walltime ends, so training can snapshot.
        return [f"#PBS -l {nodes}", f"#PBS -l walltime={format_walltime(job.walltime_s)}",
                f"#PBS -l signal={sig}@{lead}"]

    def walltime_timer(self, site: SiteProfile, job: JobSpec) -> int | None:
        return None  # Moab sends the signal

    def submit_argv(self, script: Path, workdir: Path) -> list[str]:
        return ["qsub", "-d", str(workdir), str(script)]

    def finished_state(self, job_id: str) -> JobState:
        # Torque keeps a finished job as state C for keep_completed seconds; after that it is gone
        # (Torque's `qstat -x` prints XML, it is no history).
        return JobState(GONE, "unknown to qstat (Torque keeps finished jobs only for keep_completed seconds)")


def parse_qstat_f(text: str, flavour: str = "pbs") -> JobState:
    """The state of the job in `qstat -f` output, read as PBS Pro (`pbs`) or Torque (`torque`) reports it."""
    return (Torque if flavour == "torque" else PBS)().parse_qstat_f(text)
