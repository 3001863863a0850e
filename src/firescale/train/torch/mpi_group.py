"""The MPI process group of CPU ranks: sums and broadcasts by mpi4py on the tensors' own memory, no copies.

Gloo's allreduce runs a ring over TCP, on one node over the loopback; Open MPI's copies through shared
memory, and on this repository's 2-core machine Gloo took 3 to 13 times MPI_Allreduce's time for the same bytes
(docs/benchmarks/2026-11-28-pytorch-trainer-cpu.md).  Here a contiguous CPU tensor is handed to MPI as the
NumPy view `tensor.numpy()` of its own memory and summed with MPI_Allreduce(MPI_IN_PLACE): the buffer that
torch.distributed's all_reduce would have summed, with no copy in or out.  The sum is MPI's blocking
MPI_Allreduce, whose algorithm the site's Open MPI settings choose (OMPI_MCA_coll_tuned_*, as for Horovod);
MPI_Iallreduce runs libnbc's own algorithms, which those settings do not reach.  A gradient bucket is
therefore summed when it fills, on the rank's core, while the rest of backward waits.

MPI has no bfloat16 and no standard float16: such a buffer is summed in a float32 copy of itself and rounded
back once.  Over two ranks that is the exact sum rounded to bf16 (or fp16), as Gloo's own bf16 sum gives; over
more, one rounding where a ring of bf16 additions rounds at every step.  The trainer's gradients are float32
whatever the precision (bf16 autocasts the passes, not the weights), so this is for callers' own tensors.  A
broadcast moves bytes, so any dtype goes as it is.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from firescale.errors import FirescaleError
from firescale.train.torch.rendezvous import Place, mpi_world

# Summed in a float32 copy: MPI has no type for them (MPI_Allreduce refuses NumPy's float16 with MPI_ERR_TYPE).
WIDENED = (torch.bfloat16, torch.float16)
# Summed in place as they are: MPI's C types for NumPy's views of them.
IN_PLACE = (torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def open_group(place: Place) -> Any:
    """A communicator of its own for this job's ranks (MPI_COMM_WORLD duplicated, so that no other caller's
    messages meet the gradients'), once MPI's world is checked to be the launcher's: the same size, this rank
    the same rank."""
    world = mpi_world()
    if (world.Get_size(), world.Get_rank()) != (place.size, place.rank):
        raise FirescaleError(f"the MPI process group needs ranks that MPI started as one job, but MPI's world has "
                             f"{world.Get_size()} ranks with this one as rank {world.Get_rank()}, where the launcher "
                             f"({place.launcher}) says rank {place.rank} of {place.size}; start the ranks with mpirun, "
                             "aprun or srun --mpi, or use --process-group gloo")
    return world.Dup()


def same_world(place: Place) -> bool:
    """Whether MPI's world is the launcher's job (auto takes the MPI group only then)."""
    world = mpi_world()
    return (world.Get_size(), world.Get_rank()) == (place.size, place.rank)


def _view(tensor: torch.Tensor) -> Any:
    """The NumPy view of a contiguous CPU tensor's own memory."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise FirescaleError(f"the MPI process group sums contiguous CPU tensors, not a {tensor.device.type} tensor"
                             f"{'' if tensor.is_contiguous() else ' with gaps in its memory'}; use nccl on GPUs")
    return tensor.detach().numpy()


def sum_in_place(comm: Any, flat: torch.Tensor) -> None:
    """`flat` replaced by its element-wise sum over the ranks: MPI_Allreduce(MPI_IN_PLACE) on its own memory,
    bfloat16 and float16 in a float32 copy (WIDENED)."""
    from mpi4py import MPI

    if flat.dtype not in (*IN_PLACE, *WIDENED):
        raise FirescaleError(f"the MPI process group sums float and integer tensors, not {flat.dtype}; known: "
                             f"{', '.join(str(d).removeprefix('torch.') for d in (*IN_PLACE, *WIDENED))}")
    wait_for_peers(comm)
    if flat.dtype in WIDENED:
        wide = flat.detach().float()
        comm.Allreduce(MPI.IN_PLACE, _view(wide), op=MPI.SUM)
        flat.copy_(wide)
        return
    comm.Allreduce(MPI.IN_PLACE, _view(flat), op=MPI.SUM)


# A rank that reaches a sum before its peers first looks without pausing for this long, then sleeps this long
# between looks (seconds).
PEER_SPIN_S = 1e-3
PEER_POLL_S = 50e-6


def wait_for_peers(comm: Any) -> None:
    """Return once every rank has reached this sum, sleeping after the first millisecond: a rank that
    MPI_Allreduce keeps waiting busy-polls its core, which on a node shared with anything else (a second job,
    the runner) takes time from its peers' compute; once all are there, the blocking sum runs at MPI's full
    speed.  The first millisecond it looks without sleeping: a sleep of 50 µs wakes up to a tenth of a
    millisecond late, which on a quiet node, where the last peer comes within a millisecond nearly every
    iteration, cost LeNet's 4 ms iteration 3% (docs/benchmarks/2026-12-03-pytorch-trainer-seam.md)."""
    request = comm.Ibarrier()
    spin_until = time.perf_counter() + PEER_SPIN_S
    while not request.Test():
        if time.perf_counter() > spin_until:
            time.sleep(PEER_POLL_S)


def broadcast_in_place(comm: Any, flat: torch.Tensor) -> None:
    """Rank 0's `flat` into every rank's, byte for byte (MPI_Bcast of its memory: any dtype)."""
    comm.Bcast(_view(flat.view(torch.uint8)), root=0)


def library_version() -> str:
    """The first line of the MPI library's own version string (MPI_Get_library_version), as linked here."""
    from mpi4py import MPI

    text = MPI.Get_library_version().strip()
    return text.splitlines()[0].strip() if text else "unknown"
