"""The seam between the training loop and a framework: what a backend gives the loop, and which one to load.

The loop (`train/trainer.py`) is Caffe's solver loop, written once: batches, learning rates, the
stop signal, evaluations, snapshots, records.  A backend (`train/tensorflow/`, `train/torch/`) is
everything that touches tensors: its ranks and their collectives, the net built from a NetSpec,
Caffe's update rules, the gradient, allreduce and update steps, the evaluation step.  Blobs cross
the seam as NumPy arrays in the trainer's layout (`train/params.py`), so snapshots, Caffe's weights
and records are the same whichever framework trained.  No backend imports the other, and nothing
outside `train/<backend>/` imports a framework.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from firescale.caffe.solver import SolverConfig
from firescale.errors import FirescaleError
from firescale.frameworks import (  # noqa: F401  (re-exported for the loop's callers)
    DEFAULT_FRAMEWORK,
    DEFAULT_PRECISION,
    FRAMEWORKS,
    PRECISIONS,
    PROCESS_GROUPS,
    REGISTRY,
    check_combination,
    check_framework,
    check_precision,
)
from firescale.nets.spec import NetSpec

# The tables of what each framework is and can do are firescale.frameworks'; these names stay for the callers.
LIBRARIES = {f.name: f.library for f in REGISTRY.values()}
STACK_VERSIONS = {f.name: f.stack_versions for f in REGISTRY.values()}


class CollectiveGaveUp(FirescaleError):
    """A collective that gave up waiting for a peer (its library's timeout, or a peer's connection gone): the
    collective's name in `collective` ('all_reduce (Gloo)'), the sentence for people in the message.  The
    trainer writes both into the rank's heartbeat, and the runner resubmits such a job as a stall."""

    def __init__(self, collective: str, message: str) -> None:
        super().__init__(message)
        self.collective = collective


class Steps(Protocol):
    """A backend's steps for one net and solver, traced or compiled as the framework does it."""

    def iteration(self, images: Any, labels: Any, dropout_seed: tuple[int, int], rate: float, iteration: int,
                  batch: int, stop_flag: float) -> Any:
        """A whole iteration of one micro-batch: gradients, their sum over the ranks with the loss and stop flag,
        the update; returns the summed (loss, flag) pair, left on the device (`host` reads it)."""

    def gradients(self, images: Any, labels: Any, dropout_seed: tuple[int, int]) -> tuple[Any, list[Any]]:
        """The summed loss of a micro-batch and the gradient of every blob, computed before returning."""

    def allreduce(self, grads: list[Any], loss_sum: Any, stop_flag: float) -> tuple[list[Any], Any]:
        """The learnt blobs' gradients and the (loss, flag) pair summed over the ranks, done before returning."""

    def apply(self, summed: list[Any], rate: float, iteration: int, batch: int) -> None:
        """The solver's update from gradients summed over the effective batch `batch`, done before returning."""

    def evaluate(self, images: Any, labels: Any) -> np.ndarray:
        """A test batch's [loss sum, top-1 correct, top-5 correct, images] as float64 on the host."""

    def batch(self, images: np.ndarray, labels: np.ndarray) -> tuple[Any, Any]:
        """A NumPy batch (NHWC float32 images, int64 labels) as this backend's tensors on its device."""

    def host(self, value: Any) -> np.ndarray:
        """A device value read back to the host."""

    def warm_up(self, batch: int, seed: int) -> None:
        """Every step once on zeros, the weights and history put back: no first-call cost in a timed iteration."""


class Backend(Protocol):
    """A framework's side of the seam (see the module's note)."""

    name: str

    def init_rank(self, threads: int, devices: int) -> Any: ...

    def build_net(self, spec: NetSpec, seed: int, placement: Sequence[str] | None,
                  moving_average: Mapping[str, float] | None) -> Any: ...

    def make_solver(self, config: SolverConfig, net: Any, names: Sequence[str], lr_mults: Sequence[float],
                    decay_mults: Sequence[float]) -> Any: ...

    def read_params(self, net: Any) -> dict[str, np.ndarray]: ...

    def write_params(self, net: Any, arrays: Mapping[str, np.ndarray]) -> None: ...

    def broadcast_state(self, rank: Any, net: Any, solver: Any) -> None: ...

    def broadcast_statistics(self, rank: Any, net: Any) -> None: ...

    def make_steps(self, net: Any, solver: Any, rank: Any, image_shape: tuple[int, ...], *,
                   overlap: bool) -> Steps: ...

    def gradient_bytes(self, net: Any) -> int: ...

    def describe_allreduce(self, rank: Any, *, gradient_bytes: int, overlap: bool) -> dict[str, Any]: ...

    def versions(self, rank: Any) -> dict[str, str]: ...

    def close(self, rank: Any) -> None: ...

    def gave_up(self, exc: BaseException) -> CollectiveGaveUp | None:
        """`exc` as the collective that gave up waiting for a peer, when that is what it says; else None."""

    # TensorFlow's alone so far (the loop refuses them for another backend before it starts):
    # def measure_copies(self, placement) -> placement      a split net's copy layers timed
    # def profile_layers(self, net, images, labels, rank, *, data_wait_s) -> list[LayerTrace]


def load_backend(framework: str, precision: str = DEFAULT_PRECISION, process_group: str = "auto") -> Backend:
    """The backend of `framework` for `precision` (and, for pytorch, `process_group`); one sentence when its
    framework is not installed."""
    chosen = check_combination(framework, precision, process_group)
    try:
        module = importlib.import_module(chosen.module)
    except ImportError as exc:
        raise FirescaleError(f"framework {framework!r} needs {chosen.needs}, which this Python lacks "
                             f"({exc})") from None
    backend: Backend = module.make_backend(precision, process_group)
    return backend
