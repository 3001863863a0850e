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
from firescale.cluster.collectives import PROCESS_GROUPS
from firescale.errors import FirescaleError
from firescale.nets.spec import NetSpec

FRAMEWORKS = ("tensorflow", "pytorch")
DEFAULT_FRAMEWORK = "tensorflow"
LIBRARIES = {"tensorflow": "Horovod", "pytorch": "torch.distributed"}   # whose allreduce each backend's trainer calls
# The keys of a run record's `versions` (each backend's distributed.versions) that name the framework and the
# libraries its allreduce runs on: what a kept calibration is keyed by (predict/calibration_key.py).
STACK_VERSIONS = {"tensorflow": ("tensorflow", "horovod", "mpi"), "pytorch": ("torch", "cuda", "nccl", "mpi")}
# fp32: Caffe's numerics (TF32 off); tf32: float32 values, matrix products in TF32 on GPUs that have it;
# bf16: the forward and backward passes autocast to bfloat16, the weights and the update in float32.
PRECISIONS = ("fp32", "tf32", "bf16")
DEFAULT_PRECISION = "fp32"
# The pytorch backend's process groups (PROCESS_GROUPS, resolve_process_group) live in the allreduce vocabulary,
# firescale.cluster.collectives, which the model reads too.
_MODULES = {"tensorflow": "firescale.train.tensorflow.backend", "pytorch": "firescale.train.torch.backend"}
_NEEDS = {"tensorflow": "TensorFlow and Horovod (`make setup`)", "pytorch": "PyTorch (`make setup`, or `pip install "
                                                                            "'firescale[pytorch]'`)"}


class CollectiveGaveUp(FirescaleError):
    """A collective that gave up waiting for a peer (its library's timeout, or a peer's connection gone): the
    collective's name in `collective` ('all_reduce (Gloo)'), the sentence for people in the message.  The
    trainer writes both into the rank's heartbeat, and the runner resubmits such a job as a stall."""

    def __init__(self, collective: str, message: str) -> None:
        super().__init__(message)
        self.collective = collective


def check_framework(framework: str, where: str = "--framework") -> str:
    if framework not in FRAMEWORKS:
        raise FirescaleError(f"{where} {framework!r} is not a framework firescale trains with; use one of "
                             f"{', '.join(FRAMEWORKS)}")
    return framework


def check_precision(precision: str, where: str = "--precision") -> str:
    if precision not in PRECISIONS:
        raise FirescaleError(f"{where} {precision!r} is not a precision firescale trains in; use one of "
                             f"{', '.join(PRECISIONS)}")
    return precision


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
    check_framework(framework)
    check_precision(precision)
    if framework == "tensorflow" and precision == "bf16":
        raise FirescaleError("precision 'bf16' is the pytorch backend's; the tensorflow backend trains in fp32 or "
                             "tf32 (set framework: pytorch to train in bf16)")
    if process_group not in PROCESS_GROUPS:
        raise FirescaleError(f"--process-group {process_group!r} is not one of {', '.join(PROCESS_GROUPS)}")
    if process_group != "auto" and framework != "pytorch":
        raise FirescaleError(f"--process-group {process_group} picks the pytorch backend's process group; the "
                             f"{framework} backend's ranks are Horovod's (set framework pytorch, or leave it out)")
    try:
        module = importlib.import_module(_MODULES[framework])
    except ImportError as exc:
        raise FirescaleError(f"framework {framework!r} needs {_NEEDS[framework]}, which this Python lacks "
                             f"({exc})") from None
    backend: Backend = module.make_backend(precision, process_group)
    return backend
