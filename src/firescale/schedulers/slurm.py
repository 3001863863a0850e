"""Slurm: #SBATCH directives; sbatch, squeue/sacct and scancel."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..site import format_walltime
from .base import Scheduler

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
