"""Slurm: #SBATCH directives; sbatch, squeue/sacct and scancel."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..site import format_walltime
from .base import (CANCELLED, COMPLETED, FAILED, GONE, PENDING, PREEMPTED, RUNNING, TIMEOUT, JobState,
                   Scheduler)

if TYPE_CHECKING:
    from ..render import JobSpec
    from ..site import SiteProfile


class Slurm(Scheduler):
    name = "slurm"
    template = "slurm.sh.j2"
    hosts_command = 'scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}"'
    job_id_variable = "SLURM_JOB_ID"

    def directives(self, site: "SiteProfile", job: "JobSpec") -> list[str]:
        c = site.config
        nodes = site.nodes_for(job.ranks)
        flags = {
            "--job-name": job.name,
            "--nodes": str(nodes),
            "--ntasks-per-node": str(min(job.ranks, site.gpus_per_node)),
            "--cpus-per-task": str(site.cores_per_rank),
            "--time": format_walltime(job.walltime_s),
            "--output": str(job.log_file),
            "--open-mode": "append",
            "--signal": f"B:{c['walltime_signal']['signal']}@{c['walltime_signal']['seconds_before']}",
        }
        if site.device_kind == "gpu":
            flags["--gpus-per-node"] = str(min(job.ranks, site.gpus_per_node))
        for key in ("account", "partition", "qos"):
            if c.get(key):
                flags[f"--{key}"] = c[key]
        lines = [f"#SBATCH {flag}={value}" for flag, value in sorted(flags.items())]
        return lines + [f"#SBATCH {extra}" for extra in c["directives"]]

    def submit(self, script: Path, workdir: Path) -> str:
        proc = self._run(["sbatch", "--parsable", f"--chdir={workdir}", str(script)], "sbatch")
        return proc.stdout.strip().split(";")[0]

    def poll(self, job_id: str) -> JobState:
        queue = self.runner(["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%T"])
        raw = queue.stdout.strip() if queue.returncode == 0 else ""
        if raw:
            return JobState(_SLURM_STATES.get(raw.split()[0], RUNNING), raw)
        # Not in the queue any more: ask accounting, where the cluster keeps it.
        acct = self.runner(["sacct", "--noheader", "--allocations", "--parsable2", "--jobs", job_id,
                            "--format=State,ExitCode"])
        lines = [l for l in acct.stdout.strip().splitlines() if l] if acct.returncode == 0 else []
        if not lines:
            return JobState(GONE, "not in squeue, unknown to sacct")
        state, _, exit_code = lines[0].partition("|")
        word = state.split()[0]
        code = int(exit_code.split(":")[0]) if exit_code.split(":")[0].isdigit() else None
        return JobState(_SLURM_STATES.get(word, FAILED), state, code)

    def cancel(self, job_id: str) -> None:
        self.runner(["scancel", job_id])


_SLURM_STATES = {
    "PENDING": PENDING, "CONFIGURING": PENDING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING,
    "RESV_DEL_HOLD": PENDING, "SUSPENDED": PENDING,
    "RUNNING": RUNNING, "COMPLETING": RUNNING, "STAGE_OUT": RUNNING, "SIGNALING": RUNNING, "RESIZING": RUNNING,
    "COMPLETED": COMPLETED,
    "FAILED": FAILED, "NODE_FAIL": FAILED, "OUT_OF_MEMORY": FAILED, "BOOT_FAIL": FAILED, "DEADLINE": TIMEOUT,
    "TIMEOUT": TIMEOUT, "PREEMPTED": PREEMPTED, "CANCELLED": CANCELLED, "REVOKED": CANCELLED,
}
