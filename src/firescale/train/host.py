"""This rank's host, whatever the framework: its cores (one pinned per rank) and the MPI beneath the launcher."""
from __future__ import annotations

import os
import sys


def pin_cpus(local_rank: int, local_size: int) -> list[int]:
    """Pin this rank to one core of those available when there are enough; FIRESCALE_PIN_CPUS=0 turns it off.

    One core stands in for one GPU, so every thread of the rank is pinned, not only the caller: the
    framework's threads (Horovod's background thread, TensorFlow's or PyTorch's pools) already exist by
    now, and left free they would run on a second core that a one-GPU baseline would have and a rank of
    a full node would not.
    """
    if os.environ.get("FIRESCALE_PIN_CPUS", "1") == "0" or not hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = sorted(os.sched_getaffinity(0))
    if local_size > len(cpus):
        return cpus
    per_rank = len(cpus) // local_size
    mine = cpus[local_rank * per_rank:(local_rank + 1) * per_rank][:1]
    for thread in thread_ids():
        try:
            os.sched_setaffinity(thread, mine)
        except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
            pass
    return mine


def thread_ids() -> list[int]:
    """This process's threads (Linux), else just the caller (0)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def mpi_implementation() -> str:
    """'openmpi', or 'mpich' for MPICH and libraries built from it (Cray MPICH), from MPI's version string."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:   # MPI is Horovod's to initialise and finalise, not mpi4py's
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI

    return "openmpi" if MPI.Get_library_version().startswith("Open MPI") else "mpich"
