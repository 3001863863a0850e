"""What a site's jobs need that its schema cannot say: where they queue, srun's MPI plugin, a core for every GPU.

`site lint` reports these; a site that breaks them still loads, because the schema cannot know the
cluster (a Slurm release may add a plugin), but its first job would fail or waste the node.  Each
finding is one sentence: an error where a job cannot run as written, a warning where it runs but
probably not as meant, a note where nothing is needed and why.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal

# The MPI plugins Slurm builds (`srun --mpi=list`; src/plugins/mpi of Slurm 20.11 to 24.11): "none" starts
# the ranks without any, pmix is the newest PMIx the cluster's Slurm was built with, pmix_vN one major.
SRUN_MPI_PLUGINS = ("none", "pmi2", "pmix", "pmix_v3", "pmix_v4", "pmix_v5", "cray_shasta")

# The most GPUs one node holds (NVIDIA's DGX-2 and HGX-2: 16); more is a cluster's total, not a node's.
MOST_GPUS_PER_NODE = 16

_SCHEDULER_NAMES = {"pbs": "PBS", "torque": "Torque"}

Level = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Finding:
    """One thing lint says about what the site's jobs need: its level and the sentence."""

    level: Level
    text: str


def job_needs(config: dict[str, Any]) -> list[Finding]:
    """Every finding about a validated site's config (defaults filled in), errors first."""
    findings = [*_queue(config), *_srun_mpi(config), *_cores(config)]
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(findings, key=lambda f: order[f.level])


def _queue(config: dict[str, Any]) -> list[Finding]:
    scheduler = config["scheduler"]
    if scheduler == "slurm":
        if config.get("partition"):
            return [Finding("note", f"jobs go to Slurm partition {config['partition']!r}")]
        return [Finding("error", "key 'partition': a Slurm site names the partition its jobs go to (`sinfo -s` "
                        "lists them); without one sbatch takes the cluster's default partition, which may hold no "
                        "GPU nodes, or refuses the job where there is none; give it, the default one too")]
    if scheduler in ("pbs", "torque"):
        if config.get("queue"):
            return [Finding("note", f"jobs go to {_SCHEDULER_NAMES[scheduler]} queue {config['queue']!r}")]
        return [Finding("note", "no queue: qsub sends the jobs to the server's default_queue "
                        "(`qstat -Q` lists the queues); give 'queue' to choose another")]
    return [Finding("note", "no partition or queue: the site has no scheduler, its jobs run on this machine")]


def _srun_mpi(config: dict[str, Any]) -> list[Finding]:
    plugin = config.get("srun_mpi")
    if config["launcher"] != "srun":
        if plugin:
            return [Finding("warning", f"key 'srun_mpi': {plugin!r} is not used, the launcher is "
                            f"{config['launcher']!r}; leave it out or set launcher: srun")]
        return []
    if plugin is None:
        return [Finding("note", "srun_mpi is not set: srun starts the ranks with the cluster's MpiDefault "
                        "(`scontrol show config | grep MpiDefault`)")]
    if plugin in SRUN_MPI_PLUGINS:
        return []
    near = difflib.get_close_matches(plugin, SRUN_MPI_PLUGINS, n=1)
    meant = f" (did you mean {near[0]!r}?)" if near else ""
    return [Finding("error", f"key 'srun_mpi': {plugin!r} is not an MPI plugin of Slurm{meant}; known: "
                    f"{', '.join(SRUN_MPI_PLUGINS)} (`srun --mpi=list` on a compute node shows the cluster's)")]


def _cores(config: dict[str, Any]) -> list[Finding]:
    """A rank per GPU, each with node.cores // node.gpus cores: fewer cores than GPUs is refused when the site
    loads; cores that divide unevenly stay idle, and more GPUs than any node holds is a cluster's count."""
    gpus, cores = int(config["node"]["gpus"]), int(config["node"]["cores"])
    device = "GPU" if config["device"]["kind"] == "gpu" else "rank"
    findings = []
    if cores >= gpus and cores % gpus:
        findings.append(Finding("warning", f"key 'node.cores': {cores} cores do not divide among {gpus} "
                                f"{device}s; each rank gets {cores // gpus} and {cores % gpus} stay idle; give "
                                "the cores Slurm or PBS counts on a node (`sinfo -o %c`, `pbsnodes`)"))
    if config["device"]["kind"] == "gpu" and gpus > MOST_GPUS_PER_NODE:
        findings.append(Finding("warning", f"key 'node.gpus': {gpus} GPUs on one node, where the largest nodes "
                                f"hold {MOST_GPUS_PER_NODE}; node.gpus is a node's count, not the cluster's"))
    return findings
