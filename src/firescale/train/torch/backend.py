"""The PyTorch side of the seam (firescale.train.backend): torch.distributed ranks, nn.Module nets, eager steps.

Batches arrive as NumPy NHWC arrays; on a GPU they are copied from pinned host memory without blocking,
and the NCHW view of NHWC data is PyTorch's channels-last layout, so nothing is transposed in memory.
Precision: fp32 turns TF32 off (Caffe's numerics), tf32 turns it on, bf16 autocasts the forward and
backward passes to bfloat16 while the weights, the loss and the update stay float32.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from firescale.caffe.solver import SolverConfig
from firescale.errors import FirescaleError
from firescale.model.traces import DATA_WAIT_LAYER, LayerTrace
from firescale.nets.spec import NetSpec
from firescale.train.backend import Backend, CollectiveGaveUp
from firescale.train.placement import LayerPlacement
from firescale.train.ranks import ProcessGroupAllreduce
from firescale.train.torch.distributed import FlatSum, GradientBuckets, Rank, default_bucket_bytes
from firescale.train.torch.nets import CaffeNet
from firescale.train.torch.solvers import CaffeSolver
from firescale.train.torch.steps import Blobs, eval_sums, loss_and_gradients, loss_backward


def bucket_bytes(env: Mapping[str, str] | None = None) -> int:
    """The overlapped allreduce's bucket size in bytes: FIRESCALE_BUCKET_MB (site.yaml's `torch: {bucket_mb: N}`,
    beside Horovod's fusion threshold; one sentence if it is bad), else the registry's default."""
    text = (os.environ if env is None else env).get("FIRESCALE_BUCKET_MB", "")
    if not text:
        return default_bucket_bytes()
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise FirescaleError(f"FIRESCALE_BUCKET_MB={text!r}: the overlapped allreduce's bucket is a number of MiB "
                             "above 0")
    return max(1, int(value * 2**20))


class TorchSteps:
    """One rank's eager steps for a net and its solver (see firescale.train.backend.Steps)."""

    def __init__(self, net: CaffeNet, solver: CaffeSolver, rank: Rank, autocast: torch.dtype | None,
                 buckets: GradientBuckets | None) -> None:
        self.net, self.solver, self.rank = net, solver, rank
        self.device = torch.device(rank.device)
        self.autocast = autocast
        self.buckets = buckets
        self.cuda = self.device.type == "cuda"
        self.blobs = Blobs(net)   # the net's blob lists, made once for every iteration
        # the gradients' sum through one buffer made once (none for one rank, or blobs of several dtypes)
        learnt = self.blobs.learnt
        self.flat_sum = FlatSum(rank, learnt) if rank.size > 1 and FlatSum.fits(learnt) else None
        self._flags: dict[float, torch.Tensor] = {}   # the stop flag's two values, made on the device once
        self._dropout = torch.Generator(device=self.device)   # reseeded for every micro-batch, made once

    def _flag(self, value: float) -> torch.Tensor:
        """The stop flag as a device tensor, without a host-to-device copy (and its wait) every iteration."""
        if value not in self._flags:
            self._flags[value] = torch.tensor(value, device=self.device)
        return self._flags[value]

    # ------------------------------------------------------------ data
    def batch(self, images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(np.ascontiguousarray(labels))
        if self.cuda:
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        return x.permute(0, 3, 1, 2), y

    def host(self, value: Any) -> np.ndarray:
        return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _generator(self, dropout_seed: tuple[int, int]) -> torch.Generator:
        """Dropout's masks from the run's seed and the micro-batch's global index, as the TF backend's stateless
        seed pair (the bits differ between frameworks; the distribution and its reproducibility do not)."""
        self._dropout.manual_seed((int(dropout_seed[0]) & 0xFFFFFFFF) << 32 | (int(dropout_seed[1]) & 0xFFFFFFFF))
        return self._dropout

    # ------------------------------------------------------------ steps
    def _grads(self, images: torch.Tensor, labels: torch.Tensor,
               dropout_seed: tuple[int, int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return loss_and_gradients(self.net, images, labels, self._generator(dropout_seed), self.autocast, self.blobs)

    def gradients(self, images: Any, labels: Any, dropout_seed: tuple[int, int]) -> tuple[Any, list[Any]]:
        loss_sum, grads = self._grads(images, labels, dropout_seed)   # autograd.grad: no bucket's hook runs
        self._sync()
        return loss_sum, grads

    def allreduce(self, grads: list[Any], loss_sum: Any, stop_flag: float) -> tuple[list[Any], Any]:
        reduced, pair = self._sum(grads, loss_sum, stop_flag)
        self._sync()
        return reduced, pair

    def _sum(self, grads: list[torch.Tensor], loss_sum: torch.Tensor,
             stop_flag: float) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The learnt blobs' gradients and (loss, flag) summed over the ranks in one grouped allreduce; BatchNorm's
        statistics keep their zero gradients, unsent (as the TF backend's sum_learnt)."""
        if self.flat_sum is not None:
            reduced, pair = self.flat_sum(self.blobs.learnt_of(grads), loss_sum.detach(), self._flag(stop_flag))
            return self.blobs.every_blob(reduced), pair
        pair = torch.stack([loss_sum.detach().float(), self._flag(stop_flag)])
        if self.rank.size == 1:     # nothing to sum: no lists rebuilt every iteration
            return grads, pair
        sent = self.rank.sum([*self.blobs.learnt_of(grads), pair])
        return self.blobs.every_blob(sent[:-1]), sent[-1]

    def apply(self, summed: list[Any], rate: float, iteration: int, batch: int) -> None:
        self._update(summed, rate, iteration, batch)
        self._sync()

    def _update(self, summed: list[torch.Tensor], rate: float, iteration: int, batch: int) -> None:
        torch._foreach_mul_(summed, 1.0 / float(batch))   # the mean, in place: the sums are this step's own
        self.solver.apply(summed, rate, iteration)

    def iteration(self, images: Any, labels: Any, dropout_seed: tuple[int, int], rate: float, iteration: int,
                  batch: int, stop_flag: float) -> Any:
        """Gradients, their sum with the loss and flag, the update, with no wait for the device on the host.

        Overlapped, each bucket's allreduce started during backward as its last gradient came; only the
        (loss, flag) pair is summed after it."""
        if self.buckets is None:
            loss_sum, grads = self._grads(images, labels, dropout_seed)
            reduced, pair = self._sum(grads, loss_sum, stop_flag)
        else:
            loss_sum = loss_backward(self.net, images, labels, self._generator(dropout_seed), self.autocast,
                                     self.blobs)
            reduced = self.blobs.every_blob(self.buckets.wait())
            pair = self.rank.sum([torch.stack([loss_sum.float(), self._flag(stop_flag)])])[0]
        self._update(reduced, rate, iteration, batch)
        return pair

    def evaluate(self, images: Any, labels: Any) -> np.ndarray:
        return eval_sums(self.net, images, labels, self.autocast)

    def warm_up(self, batch: int, seed: int) -> None:
        """Every step once on zeros, the weights and the solver's history put back afterwards: the allocator,
        the kernels' first choices and the process group's first allreduce are not in a timed iteration."""
        state = [*self.net.params, *self.solver.history, *self.solver.update_history]
        saved = [t.detach().clone() for t in state]
        h, w, c = self.net.spec.input_shape
        images, labels = self.batch(np.zeros((batch, h, w, c), np.float32), np.zeros((batch,), np.int64))
        loss_sum, grads = self.gradients(images, labels, (seed, 0))
        reduced, _ = self.allreduce(grads, loss_sum, 0.0)
        self.apply(reduced, 0.0, 0, batch)
        self.host(self.iteration(images, labels, (seed, 0), 0.0, 0, batch, 0.0))
        with torch.no_grad():
            for tensor, value in zip(state, saved):
                tensor.copy_(value)
        self.evaluate(images, labels)
        self._sync()


class TorchBackend:
    """PyTorch on torch.distributed (see firescale.train.backend)."""

    name = "pytorch"

    def __init__(self, precision: str, process_group: str = "auto") -> None:
        self.precision = precision
        self.process_group = process_group
        self.device = "cpu"      # this rank's, once init_rank has chosen it
        self.autocast: torch.dtype | None = None

    def gave_up(self, exc: BaseException) -> CollectiveGaveUp | None:
        """None: the Rank's collectives raise CollectiveGaveUp themselves (Rank.collective)."""
        return None

    def init_rank(self, threads: int, devices: int) -> Rank:
        from firescale.train.torch.distributed import init_rank

        rank = init_rank(threads, devices, process_group=self.process_group)
        self.device = rank.device
        self._set_precision(rank)
        return rank

    def _set_precision(self, rank: Rank) -> None:
        tf32 = self.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if self.precision == "bf16" and rank.device.startswith("cuda") and not torch.cuda.is_bf16_supported():
            raise FirescaleError(f"precision 'bf16' needs a GPU with bfloat16 arithmetic, and {rank.device} "
                                 f"({torch.cuda.get_device_name(torch.device(rank.device))}) has none; use fp32 "
                                 "or tf32")
        self.autocast = torch.bfloat16 if self.precision == "bf16" else None

    def build_net(self, spec: NetSpec, seed: int, placement: Sequence[str] | None,
                  moving_average: Mapping[str, float] | None) -> CaffeNet:
        if placement is not None:
            raise FirescaleError("the pytorch backend runs each replica on one device; split layers over devices "
                                 "with framework tensorflow")
        torch.manual_seed(seed)
        return CaffeNet(spec, seed, moving_average, device=self.device)

    def make_solver(self, config: SolverConfig, net: CaffeNet, names: Sequence[str], lr_mults: Sequence[float],
                    decay_mults: Sequence[float]) -> CaffeSolver:
        return CaffeSolver(config, net, lr_mults, decay_mults)

    def read_params(self, net: CaffeNet) -> dict[str, np.ndarray]:
        return net.read_params()

    def write_params(self, net: CaffeNet, arrays: Mapping[str, np.ndarray]) -> None:
        names = {info.name for info in net.infos}
        net.write_params({name: value for name, value in arrays.items() if name in names})

    def broadcast_state(self, rank: Rank, net: CaffeNet, solver: CaffeSolver) -> None:
        rank.broadcast_tensors([*net.params, *solver.history, *solver.update_history])

    def broadcast_statistics(self, rank: Rank, net: CaffeNet) -> None:
        if net.statistics:
            rank.broadcast_tensors(list(net.statistics))

    def make_steps(self, net: CaffeNet, solver: CaffeSolver, rank: Rank, image_shape: tuple[int, ...], *,
                   overlap: bool) -> TorchSteps:
        buckets = None
        if overlap:
            learnt = [p for p, keep in zip(net.params, net.learnt) if keep]
            buckets = GradientBuckets(rank, learnt, bucket_bytes())
        return TorchSteps(net, solver, rank, self.autocast, buckets)

    def gradient_bytes(self, net: CaffeNet) -> int:
        return sum(p.numel() * p.element_size() for p, keep in zip(net.params, net.learnt) if keep)

    def describe_allreduce(self, rank: Rank, *, gradient_bytes: int, overlap: bool) -> ProcessGroupAllreduce:
        from firescale.train.torch.distributed import describe_allreduce

        return describe_allreduce(rank, gradient_bytes=gradient_bytes, overlap=overlap,
                                  bucket_bytes=bucket_bytes() if overlap else None)

    def versions(self, rank: Rank) -> dict[str, str | None]:
        from firescale.train.torch.distributed import versions

        return {**versions(rank), "framework": self.name, "precision": self.precision}

    def measure_copies(self, placement: LayerPlacement) -> LayerPlacement:
        """Never called: `build_net` refuses a net split over devices."""
        raise FirescaleError("the pytorch backend runs each replica on one device, so it has no copies between "
                             "devices to time; split layers over devices with framework tensorflow")

    def profile_layers(self, net: CaffeNet, images: Any, labels: Any, rank: Rank, *, data_wait_s: float = 0.0,
                       repeats: int = 5, warm_up: int = 1,
                       update: Callable[[list[torch.Tensor], int], None] | None = None) -> list[LayerTrace]:
        """Each layer's forward, backward and gradient-allreduce times, timed inside real iterations of the batch
        (`steps.batch`'s tensors) in this backend's precision (train/torch/profile.py), after a `data_wait` row of
        `data_wait_s`.  With `update`, the gradients of each iteration (`warm_up` unmarked ones, then `repeats`
        marked) are applied as in training, and the trace holds no communication (`bench layers`' profile of one
        device)."""
        from firescale.train.torch.profile import profile_iterations, profile_net

        if update is None:
            return profile_net(net, images, labels, rank, data_wait_s=data_wait_s, autocast=self.autocast,
                               repeats=repeats)
        return [LayerTrace(0, DATA_WAIT_LAYER, data_wait_s * 1e6, 0.0, 0.0, 0),
                *profile_iterations(net, images, labels, autocast=self.autocast, warm_up=warm_up, iterations=repeats,
                                    update=update)]

    def close(self, rank: Rank) -> None:
        rank.close()


def make_backend(precision: str, process_group: str = "auto") -> TorchBackend:
    return TorchBackend(precision, process_group)


if TYPE_CHECKING:   # mypy holds the backend to the seam's protocol
    _SEAM: type[Backend[Rank, CaffeNet, CaffeSolver]] = TorchBackend
