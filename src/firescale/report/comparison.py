"""Two sets of runs compared point by point: each side's means, B − A with Welch's interval, a verdict."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from firescale.report.stats import Interval, mean_difference
from firescale.report.summary import run_metrics
from firescale.sweep.records import RunRecord

FASTER, SLOWER, SAME, TOO_FEW, ONLY_A, ONLY_B = (
    "faster", "slower", "no difference", "too few repeats", "only in A", "only in B")
VERDICTS = (FASTER, SLOWER, SAME, TOO_FEW, ONLY_A, ONLY_B)
MEASURES = ("iteration_s", "train_time_s", "speedup", "top1")


@dataclass(frozen=True)
class Values:
    """One side's succeeded runs of one point: each run's iteration, train time, speedup and top-1."""

    iteration_s: tuple[float, ...] = ()
    train_time_s: tuple[float, ...] = ()
    speedup: tuple[float, ...] = ()      # empty when the side has no baseline
    top1: tuple[float, ...] = ()

    @property
    def n(self) -> int:
        return len(self.iteration_s)

    def mean(self, measure: str) -> float | None:
        values = getattr(self, measure)
        return statistics.fmean(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, **{m: self.mean(m) for m in MEASURES}, "runs": {m: list(getattr(self, m))
                                                                           for m in MEASURES}}


@dataclass(frozen=True)
class Difference:
    """mean(B) − mean(A) of one measure, with Welch's interval when both sides have two runs or more."""

    value: float
    interval: Interval | None

    def to_dict(self) -> dict[str, Any]:
        i = self.interval
        return {"value": self.value, "interval": None if i is None else
                {"low": i.low, "high": i.high, "level": i.level, "df": i.df}}


def difference(a: tuple[float, ...], b: tuple[float, ...]) -> Difference | None:
    if not a or not b:
        return None
    return Difference(statistics.fmean(b) - statistics.fmean(a), mean_difference(list(b), list(a)))


@dataclass(frozen=True)
class PointComparison:
    """One point (a group of repeats: 'baseline', 'g2-b64') on both sides."""

    point: str
    baseline: bool
    gpus: int
    batch: int
    a: Values
    b: Values

    def diff(self, measure: str) -> Difference | None:
        return difference(getattr(self.a, measure), getattr(self.b, measure))

    @property
    def iteration_pct(self) -> float | None:
        """B's mean iteration against A's, in percent (+20.0: B takes a fifth longer)."""
        d, base = self.diff("iteration_s"), self.a.mean("iteration_s")
        return None if d is None or not base else d.value / base * 100.0

    @property
    def verdict(self) -> str:
        if not self.a.n or not self.b.n:
            return ONLY_B if self.b.n else ONLY_A
        d = self.diff("iteration_s")
        if d is None or d.interval is None:
            return TOO_FEW
        if d.interval.low > 0:
            return SLOWER
        return FASTER if d.interval.high < 0 else SAME

    def to_dict(self) -> dict[str, Any]:
        diffs = {m: self.diff(m) for m in MEASURES}
        return {"point": self.point, "baseline": self.baseline, "gpus": self.gpus, "batch": self.batch,
                "a": self.a.to_dict(), "b": self.b.to_dict(), "verdict": self.verdict,
                "iteration_pct": self.iteration_pct,
                "difference": {m: None if d is None else d.to_dict() for m, d in diffs.items()}}


@dataclass(frozen=True)
class Comparison:
    """Every point of either side, and the failed runs each side left out."""

    points: tuple[PointComparison, ...]
    a_label: str = "A"
    b_label: str = "B"
    a_failed: tuple[str, ...] = ()
    b_failed: tuple[str, ...] = ()

    @property
    def slower(self) -> tuple[PointComparison, ...]:
        return tuple(p for p in self.points if p.verdict == SLOWER)

    @property
    def regression(self) -> bool:
        """Whether any point's iteration is slower in B beyond its interval."""
        return bool(self.slower)

    def counts(self) -> dict[str, int]:
        return {v: n for v in VERDICTS if (n := sum(p.verdict == v for p in self.points))}

    def to_dict(self) -> dict[str, Any]:
        return {"a": {"selection": self.a_label, "failed": list(self.a_failed)},
                "b": {"selection": self.b_label, "failed": list(self.b_failed)},
                "regression": self.regression, "verdicts": self.counts(),
                "points": [p.to_dict() for p in self.points]}


def _side(records: list[RunRecord]) -> dict[str, Values]:
    """Each point's values from a side's succeeded runs; speedups against that side's own baseline."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        if record.succeeded:
            groups.setdefault(record.group, []).append(record)
    metrics = {g: [run_metrics(r) for r in members] for g, members in groups.items()}
    base = [m.time_s for m in metrics.get("baseline", [])]
    base_time = statistics.fmean(base) if base else None
    return {g: Values(tuple(m.iteration_s for m in ms), tuple(m.time_s for m in ms),
                      tuple(base_time / m.time_s for m in ms) if base_time else (), tuple(m.top1 for m in ms))
            for g, ms in metrics.items()}


def _order(records: list[RunRecord]) -> dict[str, RunRecord]:
    """One record per point, baseline first, then by GPUs, batch and rate (as the report's rows)."""
    out: dict[str, RunRecord] = {}
    for record in sorted(records, key=lambda r: (not r.baseline, r.gpus, r.batch, r.lr, r.point)):
        out.setdefault(record.group, record)
    return out


def compare_runs(a: list[RunRecord], b: list[RunRecord], *, a_label: str = "A", b_label: str = "B") -> Comparison:
    """A (the reference, before) against B (the candidate, after), point by point."""
    side_a, side_b = _side(a), _side(b)
    measured = [r for r in a + b if r.group in side_a or r.group in side_b]
    points = tuple(PointComparison(group, r.baseline, r.gpus, r.batch, side_a.get(group, Values()),
                                   side_b.get(group, Values())) for group, r in _order(measured).items())
    failed = lambda records: tuple(sorted(r.point for r in records if r.outcome == "failed"))  # noqa: E731
    return Comparison(points, a_label, b_label, failed(a), failed(b))


@dataclass(frozen=True)
class LastSweep:
    """The report's comparison with the last sweep of its experiment on its site (A that sweep, B this one)."""

    comparison: Comparison
    commit: str                 # the earlier sweep's
    finished_at: str            # ISO 8601 UTC, its last run's end
    this_commit: str = ""
    differs: tuple[str, ...] = ()   # 'numpy 1.26.4 -> 2.0.0', the versions that differ

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "finished_at": self.finished_at, "this_commit": self.this_commit,
                "versions_differ": list(self.differs), **self.comparison.to_dict()}
