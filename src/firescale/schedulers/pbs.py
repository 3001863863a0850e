"""PBS and Torque (with Moab-style extensions): #PBS directives; qsub, qstat and qdel."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..site import format_walltime
from .base import Scheduler

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


class Torque(PBS):
    name = "torque"
