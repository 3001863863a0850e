"""The PyTorch trainer's allreduce as it calls it (MPI or Gloo on CPUs, NCCL on GPUs), for `bench allreduce`.

The PyTorch trainer sums a micro-batch's gradients and its (loss, stop flag) pair with `Rank.sum`: the
tensors flattened into one buffer per dtype, one all_reduce(SUM) of each over the rank's process group
(MPI_Allreduce in place through mpi4py for the MPI group), the sums split back into tensors of the inputs'
shapes.  `TorchAllreduce` calls that same function of the rank the PyTorch backend starts
(`load_backend("pytorch", process_group=...).init_rank`) on tensors on the rank's device, so what it times is
what a training iteration pays: the copy into the flat buffer, the library's allreduce, and on a GPU the wait
for the device.  It is timed as the MPI algorithms are (bench/mpi_algorithms.time_back_to_back): the same sizes,
the repetitions back to back after one barrier, the slowest rank's time per repetition.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from firescale.bench.mpi_algorithms import launcher_placement
from firescale.errors import FirescaleError
from firescale.frameworks import PYTORCH


class TorchAllreduce:
    """`Rank.sum` of `send` (one tensor) or, with `tensors` (element counts adding up to `send`'s), of `send` cut into
    tensors of those sizes and the loss pair, as the trainer sums a net's gradients.  The process group
    (`process_group`, as the trainer's --process-group) is made on the first (warm-up) call, on the ranks MPI
    already has, through the backend's own `init_rank`; the ranks then keep the cores their launcher gave them, as
    the MPI algorithms timed before had them (init_rank pins each to one core)."""

    def __init__(self, tensors: Sequence[int] = (), process_group: str = "auto") -> None:
        self._sizes = tuple(tensors)
        self._group = process_group
        self._rank: Any = None
        self._inputs: list[torch.Tensor] = []
        self._result: list[torch.Tensor] = []

    def _start(self, comm: Any, send: np.ndarray) -> None:
        from firescale.train.backend import load_backend

        with launcher_placement():
            self._rank = load_backend(PYTORCH.name, process_group=self._group).init_rank(1, 1)
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

    def finish(self, reps: int) -> dict[str, Any]:  # noqa: ARG002 (Horovod's times a graph call)
        """The process group that summed, recorded beside the times; the group closed (made again for the next
        measurement)."""
        group = self.process_group
        if self._rank is not None:
            self._rank.close()
        return {"process_group": group}


def allreduce(tensors: Sequence[int] = (), process_group: str = "auto") -> TorchAllreduce:
    """The allreduce `bench allreduce` times: the PyTorch trainer's `Rank.sum` over `process_group`."""
    return TorchAllreduce(tensors, process_group)
