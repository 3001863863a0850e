"""`bench allreduce`'s one measurement: an allreduce of some bytes over the ranks, by an MPI algorithm or a trainer's.

The plain-MPI algorithms and their timing loop are bench/mpi_algorithms.py; each framework's trainer's allreduce
is its record's `allreduce_probe` (firescale.frameworks): bench/allreduce_tensorflow.py times the TensorFlow
backend's `Rank.sum` (Horovod's grouped allreduce, inside a graph), alone or, since Horovod's negotiation cycle
makes its time depend on the step before it, inside the trainer's own traced iteration; it is the measurement
to calibrate the communication factor from, since that is the cost a training iteration pays.
bench/allreduce_torch.py times the PyTorch backend's `Rank.sum` over its process group, alone.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from firescale.bench.allreduce_record import AllreduceMeasurement
from firescale.bench.mpi_algorithms import IMPLEMENTATIONS, check_sum, time_back_to_back
from firescale.errors import FirescaleError
from firescale.frameworks import BENCH_ALGORITHMS, Framework, by_algorithm


class FrameworkAllreduce(Protocol):
    """A trainer's allreduce as a framework's probe module gives it (`allreduce(tensors, process_group)`)."""

    def __call__(self, comm: Any, send: Any, recv: Any) -> None: ...

    def copy_result(self, recv: Any) -> None: ...

    def finish(self, reps: int) -> dict[str, Any]:
        """What the measurement records beside the times (a graph call's cost, the process group), its
        resources given back."""


def framework_last(algorithms: Sequence[str]) -> list[str]:
    """The order to measure in: every MPI algorithm before a framework's (Horovod's, torch.distributed's, which
    start a background thread or a process group).  Once hvd.init() has run, Horovod's background thread runs a
    coordination collective every cycle for the rest of the process, on the rank's core; MPI timed after that
    is disturbed several times over, which a user running plain MPI never sees
    (docs/benchmarks/2026-11-23-zen4.md, "How the benchmark was wrong before")."""
    return ([a for a in algorithms if by_algorithm(a) is None]
            + [a for a in algorithms if by_algorithm(a) is not None])


def probe_module(framework: Framework) -> Any:
    """The bench module that times `framework`'s trainer's allreduce, imported only when asked for: a run of one
    framework needs only its own."""
    return importlib.import_module(framework.allreduce_probe)


def measure_allreduce(comm: Any, algorithm: str, nbytes: int, reps: int, warmup: int = 1,
                      compute_s: float = 0.0, tensors: Sequence[int] = (), batch: int = 1,
                      input_shape: Sequence[int] = (1, 1, 1), overlap_s: float = 0.0,
                      process_group: str = "auto") -> AllreduceMeasurement:
    """Time `reps` allreduces of a float32 vector of `nbytes` (after `warmup`), checking the sum.

    With `tensors` (element counts, e.g. a net's gradients, `NetCost.gradient_tensors`), the vector is their
    total and a framework sums them as one group, as its trainer does; the MPI algorithms have no groups and
    reduce the same bytes as one buffer, as a program written with plain MPI would.

    The repetitions run back to back, after one barrier, as a training loop's allreduces do.  With `compute_s`,
    each one follows a synthetic step of about that long, and the ranks' mean step time in that repetition is
    subtracted from its slowest rank's total; a framework whose allreduce waits for a negotiation cycle runs it
    inside its trainer's own iteration instead, fed a `batch` of `input_shape` images each time; with
    `overlap_s` also with the allreduce beside compute of about that long (`AllreduceMeasurement.hidden_share`).
    A framework that names process groups sums over `process_group`, the measurement naming the group it
    resolved to.
    """
    import numpy as np

    if algorithm not in BENCH_ALGORITHMS:
        raise FirescaleError(f"unknown benchmark algorithm {algorithm!r}; known: {', '.join(BENCH_ALGORITHMS)}")
    framework = by_algorithm(algorithm)
    if framework is not None and compute_s > 0 and not framework.negotiation_cycle:
        raise FirescaleError(f"{framework.library}'s allreduce is timed on its own, not after a step (the "
                             "synthetic step is TensorFlow's): give compute_s 0")
    if overlap_s > 0 and not (framework is not None and framework.probe_overlap and compute_s > 0):
        raise FirescaleError("an overlapped allreduce is timed for Horovod's, beside a step: give compute_s > 0")
    rank, size = comm.Get_rank(), comm.Get_size()
    count = sum(tensors) if tensors else max(1, nbytes // 4)
    send = np.full(count, float(rank + 1), dtype=np.float32)
    recv = np.empty_like(send)
    if framework is not None and compute_s > 0:
        return probe_module(framework).after_step(comm, send, recv, tensors, compute_s=compute_s, reps=reps,
                                                  warmup=warmup, batch=batch, input_shape=input_shape,
                                                  overlap_s=overlap_s)
    if framework is None:
        step = None
        if compute_s > 0:
            from firescale.bench.allreduce_tensorflow import SyntheticStep

            step = SyntheticStep(compute_s).timed
        seconds, steps = time_back_to_back(comm, IMPLEMENTATIONS[algorithm], send, recv, reps, warmup, step)
        check_sum(algorithm, size, recv)
        return AllreduceMeasurement(algorithm, size, count * 4, seconds, float(np.median(steps)))
    run: FrameworkAllreduce = probe_module(framework).allreduce(tensors, process_group)
    seconds, steps = time_back_to_back(comm, run, send, recv, reps, warmup)
    run.copy_result(recv)
    recorded = run.finish(reps)
    check_sum(algorithm, size, recv)
    return AllreduceMeasurement(algorithm, size, count * 4, seconds, float(np.median(steps)), len(tensors),
                                **recorded)
