"""One rank of a data-parallel run, whichever framework: its place in the job, its collectives, its stack's versions
and the allreduce that summed its gradients.

As Horovod's horovod/tensorflow and horovod/torch wrap one HorovodBasics, each backend's `Rank`
(`train/tensorflow/distributed.py`, `train/torch/distributed.py`) is a `RankBasics`: the place (rank, size,
local rank and size, device, pinned cores) and the answers of a run of one rank are written here once, and the
backend fills in only its library's collectives of several ranks (`_sum`, `_sum_numbers`, `_barrier`,
`_broadcast_object`, `_gather_object`).  This module imports no framework.
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from firescale.cluster.collectives import decode_allreduce

T = TypeVar("T")


class Collectives(Protocol):
    """The collectives the loop calls on a rank: every rank calls each one together, in the same order."""

    def sum(self, tensors: Sequence[Any]) -> list[Any]:
        """Element-wise sums over all ranks of each of the framework's tensors."""
        ...

    def sum_numbers(self, values: Sequence[float]) -> np.ndarray:
        """Sums over all ranks of a few float64 numbers on the host (exact for counts)."""
        ...

    def barrier(self) -> None: ...

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's `obj` on every rank (any picklable value)."""
        ...

    def gather_object(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        ...


class Rank(Collectives, Protocol):
    """This process's place in the job and its collectives: what a backend's `init_rank` hands the loop."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    device: str                 # the framework's name of this rank's device (GPU:0, cuda:0, CPU:0, cpu)
    pinned_cpus: list[int]      # the cores it is pinned to (empty on a GPU)
    devices: tuple[str, ...]    # its devices when its net is split by layers (else empty: `device` alone)

    @property
    def is_root(self) -> bool: ...


@dataclass
class RankBasics:
    """The place of a rank and the collectives of a run of one rank; a backend's Rank adds those of several."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    device: str
    pinned_cpus: list[int]
    devices: tuple[str, ...] = field(default=(), kw_only=True)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def sum(self, tensors: Sequence[Any]) -> list[Any]:
        return list(tensors) if self.size == 1 else self._sum(list(tensors))

    def sum_numbers(self, values: Sequence[float]) -> np.ndarray:
        array = np.array(values, dtype=np.float64)
        return array if self.size == 1 else self._sum_numbers(array)

    def barrier(self) -> None:
        if self.size > 1:
            self._barrier()

    def broadcast_object(self, obj: T) -> T:
        return obj if self.size == 1 else self._broadcast_object(obj)

    def gather_object(self, obj: T) -> list[T]:
        return [obj] if self.size == 1 else self._gather_object(obj)

    # ---------------------------------------------------------------- the backend's, for several ranks
    def _sum(self, tensors: list[Any]) -> list[Any]:
        raise NotImplementedError

    def _sum_numbers(self, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _barrier(self) -> None:
        raise NotImplementedError

    def _broadcast_object(self, obj: T) -> T:
        raise NotImplementedError

    def _gather_object(self, obj: T) -> list[T]:
        raise NotImplementedError


def stack_versions(own: Mapping[str, str | None]) -> dict[str, str | None]:
    """Versions of the stack that produced a result: firescale's, Python's, NumPy's, mpirun's first line (None
    where there is no mpirun), the host's name, and the backend's `own` (its framework and libraries)."""
    from firescale import __version__

    return {"firescale": __version__, "python": platform.python_version(), "numpy": np.__version__, **own,
            "mpi": mpirun_version(), "hostname": socket.gethostname()}


def mpirun_version() -> str | None:
    """The first line of `mpirun --version` ("unknown" if it says nothing or fails); None without an mpirun."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return text.strip().splitlines()[0] if text.strip() else "unknown"


@dataclass(frozen=True)
class AllreduceRecord:
    """Which allreduce summed a run's gradients: the run record's `allreduce` (its keys are these fields)."""

    requested: str                  # FIRESCALE_ALLREDUCE: what the job asked for ("default")
    controller: str                 # who coordinates the ranks (Horovod's mpi or gloo, torch.distributed, mpi4py)
    cpu_operations: str             # the library of the host-side sums
    device: str
    ompi_coll_tuned: dict[str, str]  # Open MPI's coll_tuned settings the ranks saw
    nccl_algo: str | None
    horovod_knobs: dict[str, str]
    ranks: int
    library: str                    # what carried the gradients: nccl, openmpi, mpich, gloo, none
    message_bytes: int | None       # the size of one fused (or bucketed) gradient allreduce
    algorithm: str                  # in the library's own words
    model: str | None               # its cost model (model/comm.py); None with one rank
    tree: bool
    overlap: bool                   # each gradient's allreduce overlapped the backward pass
    collectives: dict[str, Any]     # the library's own facts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProcessGroupAllreduce(AllreduceRecord):
    """A torch.distributed run's allreduce: its process group, and its buckets when overlapped."""

    process_group: str = "none"
    bucket_bytes: int | None = None


def allreduce_settings(env: Mapping[str, str] | None, rank: Rank, *, library: str,
                       message_bytes: int | None, overlap: bool) -> dict[str, Any]:
    """The fields of an AllreduceRecord that read the job's environment the same way in every backend: what was
    asked for, the MPI and NCCL settings, and what `library` (with these settings) did with `message_bytes`,
    decoded by the vocabulary that set it (firescale.cluster.collectives)."""
    env = dict(os.environ if env is None else env)
    used = decode_allreduce(env, ranks=rank.size, library=library, message_bytes=message_bytes)
    return {"requested": env.get("FIRESCALE_ALLREDUCE", "default"), "device": rank.device,
            "ompi_coll_tuned": {k[len("OMPI_MCA_"):]: v for k, v in sorted(env.items())
                                if k.startswith("OMPI_MCA_coll_tuned_")},
            "nccl_algo": env.get("NCCL_ALGO"), "ranks": rank.size, "library": used.library,
            "message_bytes": message_bytes, "algorithm": used.algorithm, "model": used.model, "tree": used.tree,
            "overlap": bool(overlap)}
