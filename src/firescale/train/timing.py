"""Clocks for one training segment: start-up, training time across resumed segments, per-iteration split."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..results import EvalPoint, IterationSplit


@dataclass
class SplitSums:
    """Seconds summed over iterations: waiting for the next batch, forward/backward/update, allreduce."""

    data_wait_s: float = 0.0
    compute_s: float = 0.0
    allreduce_s: float = 0.0
    iterations: int = 0

    def add(self, data_wait_s: float, compute_s: float, allreduce_s: float) -> None:
        self.data_wait_s += data_wait_s
        self.compute_s += compute_s
        self.allreduce_s += allreduce_s
        self.iterations += 1

    def mean(self) -> IterationSplit:
        n = max(self.iterations, 1)
        return IterationSplit(self.data_wait_s / n, self.compute_s / n, self.allreduce_s / n, self.iterations)

    def to_dict(self) -> dict[str, float]:
        return {"data_wait_s": self.data_wait_s, "compute_s": self.compute_s, "allreduce_s": self.allreduce_s,
                "iterations": self.iterations}


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
