"""Clocks for one training segment: start-up, training time across resumed segments, per-iteration split."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from firescale.errors import FirescaleError
from firescale.results import EvalPoint, IterationSplit


def median_seconds(fn: Callable[[], object], repeats: int, barrier: Callable[[], None] | None = None) -> float:
    """The median wall time of `repeats` calls of `fn`, after one call that warms up (and traces) it; with
    `barrier`, every rank starts each call together."""
    if repeats < 1:
        raise FirescaleError(f"repeats must be at least 1, not {repeats}")
    fn()
    samples = []
    for _ in range(repeats):
        if barrier is not None:
            barrier()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


SPLIT_EVERY = 50   # by default every 50th iteration (and a segment's first) is timed in parts


@dataclass
class SplitSums:
    """Seconds summed over iterations.  Every iteration's wait for its batch is timed; most iterations run
    whole, as one graph (gradients, allreduce and update: `whole_s`), and the few timed in parts, with the
    host waiting between them (`split_iterations` of them), give `compute_s` and `allreduce_s`.  Snapshots
    from before whole iterations have no `split_iterations`: all their iterations were timed in parts."""

    data_wait_s: float = 0.0
    compute_s: float = 0.0
    allreduce_s: float = 0.0
    iterations: int = 0
    split_iterations: int | None = None
    whole_s: float = 0.0

    def __post_init__(self) -> None:
        if self.split_iterations is None:
            self.split_iterations = self.iterations

    def add(self, data_wait_s: float, compute_s: float, allreduce_s: float) -> None:
        """An iteration timed in parts."""
        self.data_wait_s += data_wait_s
        self.compute_s += compute_s
        self.allreduce_s += allreduce_s
        self.iterations += 1
        self.split_iterations = (self.split_iterations or 0) + 1

    def add_whole(self, data_wait_s: float, step_s: float) -> None:
        """An iteration run whole: its wait for the batch, and the one graph call (compute and allreduce)."""
        self.data_wait_s += data_wait_s
        self.whole_s += step_s
        self.iterations += 1

    def plus(self, other: SplitSums) -> SplitSums:
        return SplitSums(self.data_wait_s + other.data_wait_s, self.compute_s + other.compute_s,
                         self.allreduce_s + other.allreduce_s, self.iterations + other.iterations,
                         (self.split_iterations or 0) + (other.split_iterations or 0), self.whole_s + other.whole_s)

    def mean(self, split_every: int = SPLIT_EVERY) -> IterationSplit:
        """The mean iteration: data wait over all iterations, and the rest of the mean iteration split into
        compute and allreduce in the proportion the iterations timed in parts showed (so the three add up
        to it; a few preempted allreduces among them move the proportion, never past the iteration)."""
        n, parts = max(self.iterations, 1), self.compute_s + self.allreduce_s
        step = (self.whole_s + parts) / n
        allreduce = step * self.allreduce_s / parts if parts > 0 else 0.0
        return IterationSplit(self.data_wait_s / n, step - allreduce, allreduce, self.iterations,
                              split_iterations=self.split_iterations or 0, split_every=split_every)

    def to_dict(self) -> dict[str, float]:
        return {"data_wait_s": self.data_wait_s, "compute_s": self.compute_s, "allreduce_s": self.allreduce_s,
                "iterations": self.iterations, "split_iterations": self.split_iterations or 0,
                "whole_s": self.whole_s}


@dataclass
class SegmentClock:
    """Wall time of this segment, offset by the training time of earlier segments (MLPerf counting).

    Training time runs from `start_training()` (after init, data open and tracing) and includes
    evaluation; start-up before it is reported separately and never counted.
    """

    prior_train_s: float = 0.0
    process_start: float = field(default_factory=time.perf_counter)
    train_start: float | None = None
    eval_s: float = 0.0

    def start_training(self) -> None:
        self.train_start = time.perf_counter()

    @property
    def startup_s(self) -> float:
        end = self.train_start if self.train_start is not None else time.perf_counter()
        return end - self.process_start

    def segment_s(self) -> float:
        """Training seconds of this segment so far."""
        return 0.0 if self.train_start is None else time.perf_counter() - self.train_start

    def run_s(self) -> float:
        """Training seconds of the whole run so far (earlier segments plus this one)."""
        return self.prior_train_s + self.segment_s()


def time_to_accuracy(evals: list[EvalPoint], target: float | None) -> float | None:
    """Training wall time at the first evaluation at or above `target` (None if none reached it)."""
    if target is None:
        return None
    for point in evals:
        if point.top1 >= target:
            return point.wall_s
    return None


def now() -> float:
    return time.perf_counter()
