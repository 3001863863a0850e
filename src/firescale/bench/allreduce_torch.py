"""The PyTorch trainer's allreduce as it calls it (MPI or Gloo on CPUs, NCCL on GPUs), for `bench allreduce`.

The PyTorch trainer sums a micro-batch's gradients and its (loss, stop flag) pair with `Rank.sum`: the
tensors flattened into one buffer per dtype, one all_reduce(SUM) of each over the rank's process group
(MPI_Allreduce in place through mpi4py for the MPI group), the sums split back into tensors of the inputs'
shapes.  `TorchAllreduce` calls that same function on tensors on the rank's device, so what
it times is what a training iteration pays: the copy into the flat buffer, the library's allreduce, and on a
GPU the wait for the device.  It is timed as `measure_allreduce` times MPI_Allreduce: the same sizes, the
repetitions back to back after one barrier, the slowest rank's time per repetition.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from firescale.errors import FirescaleError


class TorchAllreduce:
    """`Rank.sum` of `send` (one tensor) or, with `tensors` (element counts adding up to `send`'s), of `send` cut into
    tensors of those sizes and the loss pair, as the trainer sums a net's gradients.  The process group
    (`process_group`, as the trainer's --process-group) is made on the first (warm-up) call, on the ranks MPI
    already has, through the trainer's own `init_rank`; the ranks then
    keep the cores their launcher gave them, as the MPI algorithms timed before had them (init_rank would pin each
    to one core)."""

    def __init__(self, tensors: Sequence[int] = (), process_group: str = "auto") -> None:
        self._sizes = tuple(tensors)
        self._group = process_group
        self._rank: Any = None
        self._inputs: list[torch.Tensor] = []
        self._result: list[torch.Tensor] = []

    def _start(self, comm: Any, send: np.ndarray) -> None:
        from firescale.train.host import thread_ids
        from firescale.train.torch.distributed import init_rank

        placed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self._rank = init_rank(1, process_group=self._group)
        if placed is not None:
            for thread in thread_ids():
                try:
                    os.sched_setaffinity(thread, placed)
                except (ProcessLookupError, PermissionError):   # the thread ended meanwhile
                    pass
        if self._rank.size != comm.Get_size():
            raise FirescaleError(f"torch.distributed sees {self._rank.size} ranks but MPI {comm.Get_size()}; "
                                 "launch with mpirun")
        device = torch.device(self._rank.device)
        whole = torch.from_numpy(send).to(device)
        if self._sizes:   # each gradient a tensor of its own, and the loss and stop flag
            self._inputs = [t.clone() for t in whole.split(list(self._sizes))] + [whole[:2].clone()]
        else:
            self._inputs = [whole]

    def __call__(self, comm: Any, send: np.ndarray, recv: np.ndarray) -> None:
        if self._rank is None:
            self._start(comm, send)
        self._result = self._rank.sum(self._inputs)
        if self._rank.device.startswith("cuda"):
            torch.cuda.synchronize(torch.device(self._rank.device))

    @property
    def process_group(self) -> str:
        """gloo, mpi, nccl, or none (one rank); '' before the first call."""
        return self._rank.process_group if self._rank is not None else ""

    def copy_result(self, recv: np.ndarray) -> None:
        """The last sum into `recv`, the loss pair left out (outside the timed calls, as Horovod's)."""
        sums = self._result[:-1] if self._sizes else self._result
        np.copyto(recv, torch.cat([t.reshape(-1) for t in sums]).cpu().numpy())

    def close(self) -> None:
        if self._rank is not None:
            self._rank.close()
