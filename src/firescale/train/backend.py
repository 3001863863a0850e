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
from typing import Any, Protocol, TypeVar

import numpy as np

from firescale.caffe.solver import SolverConfig
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_PRECISION, check_combination
from firescale.model.traces import LayerTrace
from firescale.nets.spec import NetSpec
from firescale.train.params import ParamInfo
from firescale.train.placement import LayerPlacement
from firescale.train.ranks import AllreduceRecord, Rank


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


class Net(Protocol):
    """A backend's net built from a NetSpec (`build_net`): its blobs in Caffe's order, each described by `infos`."""

    @property
    def spec(self) -> NetSpec: ...

    @property
    def infos(self) -> list[ParamInfo]:
        """Every blob's layer, kind, index and shape in the trainer's layout, in Caffe's order."""
        ...


class Solver(Protocol):
    """A backend's Caffe update rule (`make_solver`) over a net's blobs, and its history for snapshots."""

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Caffe's history blobs as NumPy arrays, keyed `history/<blob>` and `update_history/<blob>`."""
        ...

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The history blobs `state_arrays` wrote, put back (a missing key is a KeyError)."""
        ...


R = TypeVar("R", bound=Rank)
N = TypeVar("N", bound=Net)
S = TypeVar("S", bound=Solver)


class Backend(Protocol[R, N, S]):
    """A framework's side of the seam (see the module's note), over its own rank, net and solver: the loop hands
    a backend only the rank, net and solver that backend made, so it sees them as `Backend[Rank, Net, Solver]`."""

    name: str

    def init_rank(self, threads: int, devices: int) -> R:
        """This rank's place and collectives, pinned to its device (or its replica's `devices`)."""
        ...

    def build_net(self, spec: NetSpec, seed: int, placement: Sequence[str] | None,
                  moving_average: Mapping[str, float] | None) -> N:
        """The net of `spec` with Caffe's fillers from `seed`, its layers on `placement`'s devices if given."""
        ...

    def make_solver(self, config: SolverConfig, net: N, names: Sequence[str], lr_mults: Sequence[float],
                    decay_mults: Sequence[float]) -> S: ...

    def read_params(self, net: N) -> dict[str, np.ndarray]:
        """Every blob of `net` in the trainer's layout, by its name (ParamInfo.name)."""
        ...

    def write_params(self, net: N, arrays: Mapping[str, np.ndarray]) -> None:
        """The blobs `arrays` names into `net` (others keep their values)."""
        ...

    def broadcast_state(self, rank: R, net: N, solver: S) -> None:
        """Rank 0's weights and solver history on every rank."""
        ...

    def broadcast_statistics(self, rank: R, net: N) -> None:
        """Rank 0's BatchNorm statistics on every rank (nothing for a net without them)."""
        ...

    def make_steps(self, net: N, solver: S, rank: R, image_shape: tuple[int, ...], *, overlap: bool) -> Steps: ...

    def gradient_bytes(self, net: N) -> int:
        """The bytes of the learnt blobs' gradients that one iteration sums over the ranks."""
        ...

    def describe_allreduce(self, rank: R, *, gradient_bytes: int, overlap: bool) -> AllreduceRecord: ...

    def versions(self, rank: R) -> dict[str, str | None]:
        """The stack that trains (train/ranks.py's stack_versions), with `framework` and `precision`."""
        ...

    def close(self, rank: R) -> None: ...

    def gave_up(self, exc: BaseException) -> CollectiveGaveUp | None:
        """`exc` as the collective that gave up waiting for a peer, when that is what it says; else None."""
        ...

    def measure_copies(self, placement: LayerPlacement) -> LayerPlacement:
        """A net split over devices (firescale.frameworks' `layer_plans`): each boundary's copy timed."""
        ...

    def profile_layers(self, net: N, images: Any, labels: Any, rank: R, *, data_wait_s: float) -> list[LayerTrace]:
        """Each layer's forward, backward and gradient-allreduce times on one batch of this backend's tensors
        (`steps.batch`), after a `data_wait` row holding `data_wait_s` (model/traces.py); every rank calls it."""
        ...


def load_backend(framework: str, precision: str = DEFAULT_PRECISION,
                 process_group: str = "auto") -> Backend[Rank, Net, Solver]:
    """The backend of `framework` for `precision` (and, for pytorch, `process_group`); one sentence when its
    framework is not installed."""
    chosen = check_combination(framework, precision, process_group)
    try:
        module = importlib.import_module(chosen.module)
    except ImportError as exc:
        raise FirescaleError(f"framework {framework!r} needs {chosen.needs}, which this Python lacks "
                             f"({exc})") from None
    backend: Backend[Rank, Net, Solver] = module.make_backend(precision, process_group)
    return backend
