"""Launchers place N ranks inside an allocation: srun, aprun, mpirun, horovodrun wrap a command."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from firescale.errors import FirescaleError


class EnvRef(str):
    """An argv element that is the value of a variable set by the job body at run time (`"${NAME}"`)."""


@dataclass(frozen=True)
class Placement:
    """Where ranks go: how many in all, per node, cores for each, and the devices each rank drives (more
    than one when a replica's layers are split over devices)."""

    ranks: int
    ranks_per_node: int
    cores_per_rank: int
    nodes: int
    devices_per_rank: int = 1

    @property
    def devices_per_node(self) -> int:
        """The devices the ranks of one node drive."""
        return self.ranks_per_node * self.devices_per_rank


# How a launcher carries the job body's variables to ranks on other nodes.  srun, aprun and horovodrun
# pass the launching environment on themselves; mpirun passes only the names listed in this variable
# (Open MPI's equivalent of one -x per name; it refuses -x beside it).
# Its names are separated by ';'.
ENV_LIST_VARIABLE = {"mpirun": "OMPI_MCA_mca_base_env_list"}


def srun(cmd: Sequence[str], p: Placement, options: Sequence[str] = ()) -> list[str]:
    return ["srun", f"--nodes={p.nodes}", f"--ntasks={p.ranks}", f"--ntasks-per-node={p.ranks_per_node}",
            f"--cpus-per-task={p.cores_per_rank}", "--kill-on-bad-exit=1", *options, *cmd]


def aprun(cmd: Sequence[str], p: Placement, options: Sequence[str] = ()) -> list[str]:
    # -n ranks in all, -N per node, -d cores (depth) for each rank's threads.
    return ["aprun", "-n", str(p.ranks), "-N", str(p.ranks_per_node), "-d", str(p.cores_per_rank),
            *options, *cmd]


def mpirun(cmd: Sequence[str], p: Placement, options: Sequence[str] = ()) -> list[str]:
    # The host list comes from the scheduler's allocation (Open MPI reads Slurm and PBS itself); the
    # job body lists the variables every rank needs in OMPI_MCA_mca_base_env_list (ENV_LIST_VARIABLE).
    return ["mpirun", "-np", str(p.ranks), "--map-by", f"ppr:{p.ranks_per_node}:node:PE={p.cores_per_rank}",
            "--bind-to", "core", *options, *cmd]


def horovodrun(cmd: Sequence[str], p: Placement, options: Sequence[str] = ()) -> list[str]:
    # The job body computes the allocation's "host:slots,..." list at run time. `--` ends horovodrun's
    # own options: without it, its parser takes `--out` for its `--output-filename`.
    return ["horovodrun", "-np", str(p.ranks), "-H", EnvRef("FIRESCALE_HOSTS_SLOTS"), *options, "--", *cmd]


LAUNCHERS: dict[str, Callable[[Sequence[str], Placement, Sequence[str]], list[str]]] = {
    "srun": srun,
    "aprun": aprun,
    "mpirun": mpirun,
    "horovodrun": horovodrun,
}


def wrap(launcher: str, cmd: Sequence[str], placement: Placement, options: Sequence[str] = ()) -> list[str]:
    """argv that runs `cmd` as `placement.ranks` ranks with the named launcher."""
    try:
        fn = LAUNCHERS[launcher]
    except KeyError:
        known = ", ".join(sorted(LAUNCHERS))
        raise FirescaleError(f"unknown launcher {launcher!r}; known launchers: {known}") from None
    return fn(cmd, placement, options)
