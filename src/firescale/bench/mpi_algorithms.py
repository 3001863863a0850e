"""FireCaffe's Figure 4 experiment: parameter-server, tree and ring gradient aggregation written with MPI, and
MPI_Allreduce itself, timed back to back as a training loop's allreduces run."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from firescale.errors import FirescaleError
from firescale.frameworks import MPI_ALLREDUCE


def ps_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """Parameter server on rank 0: receive every worker's gradient in turn, sum, send the sum to each."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        np.copyto(recv, send)
        incoming = np.empty_like(send)
        for worker in range(1, size):
            comm.Recv(incoming, source=worker, tag=11)
            recv += incoming
        for worker in range(1, size):
            comm.Send(recv, dest=worker, tag=12)
    else:
        comm.Send(send, dest=0, tag=11)
        comm.Recv(recv, source=0, tag=12)


def tree_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """Binomial tree: reduce to rank 0 in ceil(log2 p) rounds, then broadcast back down the same tree."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    np.copyto(recv, send)
    incoming = np.empty_like(send)
    mask = 1
    while mask < size:                      # reduce: at round k, ranks with bit k set send and stop
        if rank & mask:
            comm.Send(recv, dest=rank - mask, tag=21)
            break
        if rank + mask < size:
            comm.Recv(incoming, source=rank + mask, tag=21)
            recv += incoming
        mask <<= 1
    # broadcast: walk the same tree from the root outwards
    mask = 1
    while mask < size:
        mask <<= 1
    mask >>= 1
    while mask >= 1:
        if rank % (2 * mask) == 0 and rank + mask < size:
            comm.Send(recv, dest=rank + mask, tag=22)
        elif rank % (2 * mask) == mask:
            comm.Recv(recv, source=rank - mask, tag=22)
        mask >>= 1


def ring_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """Ring: p-1 reduce-scatter steps then p-1 allgather steps, each passing one 1/p chunk on."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    np.copyto(recv, send)
    if size == 1:
        return
    bounds = np.linspace(0, recv.size, size + 1).astype(int)
    chunk = [recv[bounds[i]:bounds[i + 1]] for i in range(size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    scratch = np.empty(max(len(c) for c in chunk), dtype=recv.dtype)
    for step in range(size - 1):            # reduce-scatter
        out_i, in_i = (rank - step) % size, (rank - step - 1) % size
        buf = scratch[:len(chunk[in_i])]
        comm.Sendrecv(chunk[out_i], dest=right, sendtag=31, recvbuf=buf, source=left, recvtag=31)
        chunk[in_i] += buf
    for step in range(size - 1):            # allgather
        out_i, in_i = (rank + 1 - step) % size, (rank - step) % size
        buf = scratch[:len(chunk[in_i])]
        comm.Sendrecv(chunk[out_i], dest=right, sendtag=32, recvbuf=buf, source=left, recvtag=32)
        chunk[in_i][...] = buf


def mpi_allreduce(comm: Any, send: Any, recv: Any) -> None:
    """MPI_Allreduce with whatever algorithm the MPI library (and its MCA settings) chooses."""
    from mpi4py import MPI

    comm.Allreduce(send, recv, op=MPI.SUM)


IMPLEMENTATIONS: dict[str, Callable[[Any, Any, Any], None]] = {
    "ps": ps_allreduce, "tree": tree_allreduce, "ring": ring_allreduce, MPI_ALLREDUCE: mpi_allreduce,
}


def time_back_to_back(comm: Any, run: Callable[[Any, Any, Any], None], send: Any, recv: Any, reps: int,
                      warmup: int = 1, step: Callable[[], float] | None = None) -> tuple[list[float], list[float]]:
    """`warmup` + `reps` calls of `run` after one barrier, back to back; per timed repetition the slowest rank's
    time and the ranks' mean `step` (a timed compute before each call, returning its seconds; none: 0), the
    second taken out of the first.

    Gathered once, after the timed calls: an MPI call between repetitions would run beside a framework's
    background thread and delay its next cycle.  Each allreduce holds the ranks in step, so the slowest
    rank's time per repetition is what that repetition cost."""
    import numpy as np
    from mpi4py import MPI

    local = np.zeros((warmup + reps, 2))      # per repetition: this rank's total and its step
    comm.Barrier()
    for rep in range(warmup + reps):
        start = time.perf_counter()
        stepped = step() if step is not None else 0.0
        run(comm, send, recv)
        local[rep] = time.perf_counter() - start, stepped
    slowest, summed = np.empty(len(local)), np.empty(len(local))
    comm.Allreduce(np.ascontiguousarray(local[:, 0]), slowest, op=MPI.MAX)
    comm.Allreduce(np.ascontiguousarray(local[:, 1]), summed, op=MPI.SUM)
    mean_steps = summed[warmup:] / comm.Get_size()
    return [float(x) for x in slowest[warmup:] - mean_steps], [float(x) for x in mean_steps]


def check_sum(algorithm: str, size: int, recv: Any) -> None:
    """Every rank sent its rank + 1: the sum is size (size + 1) / 2 everywhere, or the implementation is wrong."""
    expected = size * (size + 1) / 2
    if not (recv[0] == expected and recv[-1] == expected):
        raise FirescaleError(f"{algorithm} allreduce on {size} ranks gave {recv[0]} and {recv[-1]}, "
                             f"expected {expected}: the implementation is wrong")


@contextmanager
def launcher_placement() -> Iterator[None]:
    """Inside, a framework's rank is initialised as its trainer does (pinned to one core); after, every thread of
    the process is given back the cores its launcher gave it, as the MPI algorithms timed before had them."""
    from firescale.train.host import thread_ids

    placed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    yield
    if placed is not None:
        for thread in thread_ids():
            try:
                os.sched_setaffinity(thread, placed)
            except (ProcessLookupError, PermissionError):   # the thread ended meanwhile
                pass
