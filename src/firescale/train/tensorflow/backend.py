"""The TensorFlow side of the seam (firescale.train.backend): Horovod ranks, tf.Module nets, traced steps."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from firescale.caffe.solver import SolverConfig
from firescale.model.traces import LayerTrace
from firescale.nets.spec import NetSpec
from firescale.train.backend import Backend, CollectiveGaveUp
from firescale.train.placement import LayerPlacement
from firescale.train.ranks import AllreduceRecord
from firescale.train.tensorflow.distributed import Rank
from firescale.train.tensorflow.nets import CaffeNet
from firescale.train.tensorflow.solvers import CaffeSolver
from firescale.train.tensorflow.steps import TrainSteps


@dataclass
class TensorFlowSteps:
    """The traced steps of `firescale.train.tensorflow.steps` behind the backend's Steps protocol."""

    traced: TrainSteps
    net: CaffeNet
    solver: CaffeSolver
    rank: Rank
    image_shape: tuple[int, ...]

    def iteration(self, images: Any, labels: Any, dropout_seed: tuple[int, int], rate: float, iteration: int,
                  batch: int, stop_flag: float) -> Any:
        return self.traced.iteration(images, labels, tf.constant(dropout_seed, tf.int64), tf.constant(rate, tf.float32),
                                     tf.constant(iteration, tf.int64), tf.constant(float(batch)),
                                     tf.constant(stop_flag))

    def gradients(self, images: Any, labels: Any, dropout_seed: tuple[int, int]) -> tuple[Any, list[Any]]:
        loss_sum, grads = self.traced.grad(images, labels, tf.constant(dropout_seed, tf.int64))
        _ = loss_sum.numpy()
        return loss_sum, list(grads)

    def allreduce(self, grads: list[Any], loss_sum: Any, stop_flag: float) -> tuple[list[Any], Any]:
        from firescale.train.tensorflow.steps import sum_learnt

        reduced, pair = sum_learnt(self.net, self.rank.sum, grads, tf.stack([loss_sum, tf.constant(stop_flag)]))
        _ = pair.numpy()
        return reduced, pair

    def apply(self, summed: list[Any], rate: float, iteration: int, batch: int) -> None:
        self.traced.apply(summed, tf.constant(rate, tf.float32), tf.constant(iteration, tf.int64),
                          tf.constant(float(batch)))

    def evaluate(self, images: Any, labels: Any) -> np.ndarray:
        return self.traced.evaluate(images, labels).numpy()

    def batch(self, images: np.ndarray, labels: np.ndarray) -> tuple[Any, Any]:
        return images, labels     # the concrete functions take NumPy arrays as they are

    def host(self, value: Any) -> np.ndarray:
        return value.numpy()

    def warm_up(self, batch: int, seed: int) -> None:
        from firescale.train.tensorflow.steps import warm_up

        warm_up(self.traced, batch, self.image_shape, seed,
                self.net.params + self.solver.history + self.solver.update_history)
        learnt = [p for p, keep in zip(self.net.params, self.net.learnt) if keep]
        self.rank.sum([tf.zeros_like(p) for p in learnt] + [tf.zeros(2)])  # negotiate Horovod's first allreduce


class TensorFlowBackend:
    """TensorFlow 2 with Horovod (see firescale.train.backend)."""

    name = "tensorflow"

    def __init__(self, precision: str) -> None:
        self.precision = precision    # fp32 or tf32 (load_backend refuses bf16 for this backend)

    def gave_up(self, exc: BaseException) -> CollectiveGaveUp | None:
        """Horovod's error once its stall check shut it down (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: a rank alive
        but missing from a collective), or a peer's exit ended it: the collective that gave up.  A rank that is
        stopped blocks Horovod's own negotiation, so no check runs: that is the runner's stall watch's to end."""
        text = str(exc)
        if not isinstance(exc, tf.errors.OpError) or "Horovod has been shut down" not in text:
            return None
        words = re.sub(r"^\{\{[^}]*\}\}\s*", "", (text.strip().splitlines() or ["Horovod has been shut down"])[0])
        return CollectiveGaveUp("allreduce (Horovod)", f"Horovod's allreduce gave up: {words[:300]}; a peer stopped, "
                                "hangs or is gone (Horovod shuts down after the site's "
                                "collective_timeout.horovod_stall_shutdown_seconds)")

    def init_rank(self, threads: int, devices: int) -> Rank:
        """Horovod initialised, this rank pinned to its device; one rank shuts Horovod down again (the trainer's
        `set_up_ranks` says why)."""
        from firescale.train.tensorflow.distributed import init_rank

        rank = init_rank(threads, devices)
        # TensorFlow computes float32 matrix products in TF32 on GPUs that have it unless told not to.
        tf.config.experimental.enable_tensor_float_32_execution(self.precision == "tf32")
        if rank.size == 1:
            rank.hvd.shutdown()
        return rank

    def build_net(self, spec: NetSpec, seed: int, placement: Sequence[str] | None,
                  moving_average: Mapping[str, float] | None) -> CaffeNet:
        from firescale.train.tensorflow.nets import build_net

        tf.random.set_seed(seed)
        return build_net(spec, seed, placement, moving_average)

    def make_solver(self, config: SolverConfig, net: CaffeNet, names: Sequence[str], lr_mults: Sequence[float],
                    decay_mults: Sequence[float]) -> CaffeSolver:
        return CaffeSolver(config, net.params, names, lr_mults, decay_mults)

    def read_params(self, net: CaffeNet) -> dict[str, np.ndarray]:
        return {info.name: var.numpy() for info, var in zip(net.infos, net.params)}

    def write_params(self, net: CaffeNet, arrays: Mapping[str, np.ndarray]) -> None:
        for var, info in zip(net.params, net.infos):
            if info.name in arrays:
                var.assign(arrays[info.name])

    def broadcast_state(self, rank: Rank, net: CaffeNet, solver: CaffeSolver) -> None:
        rank.broadcast_variables(net.params + solver.history + solver.update_history)

    def broadcast_statistics(self, rank: Rank, net: CaffeNet) -> None:
        if net.statistics:
            rank.broadcast_variables(net.statistics)

    def make_steps(self, net: CaffeNet, solver: CaffeSolver, rank: Rank, image_shape: tuple[int, ...], *,
                   overlap: bool) -> TensorFlowSteps:
        from firescale.train.tensorflow.steps import make_train_steps

        traced = make_train_steps(net, solver, image_shape, rank.sum, sum_each=rank.sum_each if overlap else None)
        return TensorFlowSteps(traced, net, solver, rank, image_shape)

    def gradient_bytes(self, net: CaffeNet) -> int:
        return sum(p.shape.num_elements() * p.dtype.size for p, keep in zip(net.params, net.learnt) if keep)

    def describe_allreduce(self, rank: Rank, *, gradient_bytes: int, overlap: bool) -> AllreduceRecord:
        from firescale.train.tensorflow.distributed import describe_allreduce

        return describe_allreduce(rank, gradient_bytes=gradient_bytes, overlap=overlap)

    def versions(self, rank: Rank) -> dict[str, str | None]:
        from firescale.train.tensorflow.distributed import versions

        return {**versions(), "framework": self.name, "precision": self.precision}

    def measure_copies(self, placement: LayerPlacement) -> LayerPlacement:
        """Each boundary's copy layer timed (a net split over devices, TensorFlow's alone so far)."""
        from firescale.train.tensorflow.placement import measure_copies

        return measure_copies(placement)

    def profile_layers(self, net: CaffeNet, images: Any, labels: Any, rank: Rank, *,
                       data_wait_s: float) -> list[LayerTrace]:
        """Each layer's forward, backward and allreduce times, each layer traced and timed on its own
        (`--profile-layers`, train/tensorflow/profile.py)."""
        from firescale.train.tensorflow.profile import profile_net

        return profile_net(net, images, labels, rank, data_wait_s=data_wait_s)

    def close(self, rank: Rank) -> None:
        """Nothing to close: Horovod shuts down at exit."""


def make_backend(precision: str, process_group: str = "auto") -> TensorFlowBackend:  # noqa: ARG001 (Horovod's)
    return TensorFlowBackend(precision)


if TYPE_CHECKING:   # mypy holds the backend to the seam's protocol
    _SEAM: type[Backend[Rank, CaffeNet, CaffeSolver]] = TensorFlowBackend
