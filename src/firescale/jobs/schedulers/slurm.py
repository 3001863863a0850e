"""Slurm: #SBATCH directives; sbatch, squeue/sacct and scancel."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from firescale.cluster.site import format_walltime
from firescale.jobs.schedulers.base import (
    CANCELLED,
    COMPLETED,
    FAILED,
    GONE,
    NODE_FAIL,
    OUT_OF_MEMORY,
    PENDING,
    PREEMPTED,
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


class Slurm(Scheduler):
    name = "slurm"
    template = "slurm.sh.j2"
    hosts_command = 'scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}"'
    job_id_variable = "SLURM_JOB_ID"

    def directives(self, site: SiteProfile, job: JobSpec) -> list[str]:
        c = site.config
        placement = site.placement(job.ranks, job.devices_per_rank)
        signal, lead = site.walltime_signal(job.framework)
        flags: dict[str, str | None] = {
            "--job-name": job.name,
            "--nodes": str(placement.nodes),
            "--ntasks-per-node": str(placement.ranks_per_node),
            "--cpus-per-task": str(placement.cores_per_rank),
            "--time": format_walltime(job.walltime_s),
            "--output": str(job.log_file),
            "--open-mode": "append",
            "--signal": f"B:{signal}@{lead}",
            # firescale resubmits a job itself (from its newest snapshot, counted against max_resubmits);
            # a requeue by Slurm would rerun the script under the same id, unseen and uncounted.
            "--no-requeue": None,
        }
        if site.device_kind == "gpu":
            flags["--gpus-per-node"] = str(placement.devices_per_node)
        for key in ("account", "partition", "qos"):
            if c.get(key):
                flags[f"--{key}"] = c[key]
        lines = [f"#SBATCH {flag}" + ("" if value is None else f"={value}") for flag, value in sorted(flags.items())]
        return lines + [f"#SBATCH {extra}" for extra in c["directives"]]

    def submit_with(self, script: Path, workdir: Path, env: Mapping[str, str]) -> str:
        # sbatch passes its environment on to the job (--export=ALL, unless the site says otherwise).
        proc = self._run(["sbatch", "--parsable", f"--chdir={workdir}", str(script)], "sbatch", env)
        return proc.stdout.strip().split(";")[0]

    def poll(self, job_id: str) -> JobState:
        queue = self.runner(["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%T"])
        words = queue.stdout.split() if queue.returncode == 0 else []
        if words:
            return JobState(_SLURM_STATES.get(words[0], RUNNING), words[0])
        if queue.returncode != 0 and not says(queue, "Invalid job id"):
            return JobState(UNKNOWN, f"squeue failed: {last_line(queue)}")
        # Not in the queue (any more): ask accounting, where the cluster keeps finished jobs.
        acct = self.runner(["sacct", "--noheader", "--allocations", "--parsable2", "--jobs", job_id,
                            "--format=State,ExitCode"])
        if acct.returncode != 0:
            if says(acct, "accounting storage is disabled"):
                return JobState(GONE, "not in squeue; Slurm accounting is disabled")
            return JobState(UNKNOWN, f"not in squeue, and sacct failed: {last_line(acct)}")
        lines = [line for line in acct.stdout.strip().splitlines() if line]
        if not lines:
            return JobState(GONE, "not in squeue, unknown to sacct")
        state, _, exit_code = lines[0].partition("|")
        word = state.split()[0] if state.split() else "UNKNOWN"
        code = exit_code.split(":")[0]
        return JobState(_SLURM_STATES.get(word, FAILED), state, int(code) if code.isdigit() else None)

    def cancel(self, job_id: str) -> None:
        # scancel exits 0 for a job that already ended; a non-zero exit means the controller refused.
        self._run(["scancel", job_id], "scancel")


# Slurm's job states (squeue/sacct) in our words.  A job is rendered with --no-requeue, so Slurm never
# puts it back in the queue itself: REQUEUED is seen only where an administrator requeues it by hand.
_SLURM_STATES = {
    "PENDING": PENDING, "CONFIGURING": PENDING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING,
    "REQUEUE_FED": PENDING, "RESV_DEL_HOLD": PENDING, "SUSPENDED": PENDING, "STOPPED": PENDING,
    "RUNNING": RUNNING, "COMPLETING": RUNNING, "STAGE_OUT": RUNNING, "SIGNALING": RUNNING, "RESIZING": RUNNING,
    "COMPLETED": COMPLETED,
    "FAILED": FAILED, "SPECIAL_EXIT": FAILED, "DEADLINE": FAILED,
    "NODE_FAIL": NODE_FAIL, "BOOT_FAIL": NODE_FAIL, "OUT_OF_MEMORY": OUT_OF_MEMORY,
    "TIMEOUT": TIMEOUT, "PREEMPTED": PREEMPTED, "CANCELLED": CANCELLED, "REVOKED": CANCELLED,
}
