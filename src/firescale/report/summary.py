"""From run records to report rows: per-run metrics, repeats as mean ± std, speedup, parity, predictions."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import load_json
from ..errors import FirescaleError
from ..results import EvalPoint
from ..sweep.records import RunRecord
from .parity import Parity, check_parity


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation over repeats (std is None for a single repeat)."""

    mean: float
    std: float | None
    n: int

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        if not values:
            raise ValueError("no values")
        std = statistics.stdev(values) if len(values) > 1 else None
        return cls(statistics.fmean(values), std, len(values))

    def scaled(self, factor: float) -> "Stat":
        return Stat(self.mean * factor, None if self.std is None else self.std * factor, self.n)


@dataclass(frozen=True)
class RunMetrics:
    """What one succeeded run contributes to its row."""

    point: str
    has_target: bool
    reached_target: bool
    time_s: float          # time-to-accuracy, or the whole train time when the target was not reached
    epochs: float
    top1: float
    top5: float
    data_wait_s: float
    compute_s: float
    allreduce_s: float
    evals: list[EvalPoint]

    @property
    def iteration_s(self) -> float:
        return self.data_wait_s + self.compute_s + self.allreduce_s


def run_metrics(record: RunRecord, target: float | None = None) -> RunMetrics:
    """The eval a run is judged by: the first at or above its target if it reached it, else its last.

    A run trained without a target of its own (the baseline) is timed to `target` when given: the
    first of its evals at or above it, so the baseline and the sweep points race to the same accuracy.
    Its accuracy stays its final one, the figure the sweep points are judged against.
    """
    train = record.train
    if train is None or not train.evals:
        raise FirescaleError(f"{record.source}: no evaluations to report")
    chosen = train.evals[-1]
    reached = bool(train.reached_target and train.time_to_accuracy_s is not None)
    if reached and train.target_top1 is not None:
        chosen = next((e for e in train.evals if e.top1 >= train.target_top1), chosen)
    time_s = float(train.time_to_accuracy_s) if reached else float(train.train_time_s)
    epochs = float(chosen.epoch) if reached else float(train.epochs)
    has_target = train.target_top1 is not None
    if not has_target and target is not None:
        hit = next((e for e in train.evals if e.top1 >= target), None)
        if hit is not None:
            has_target, reached, time_s, epochs = True, True, float(hit.wall_s), float(hit.epoch)
    if time_s <= 0:
        raise FirescaleError(f"{record.source}: its {'time to accuracy' if reached else 'train time'} is "
                             f"{time_s} s; speedups need a positive time")
    split = train.per_iteration
    return RunMetrics(record.point, has_target, reached, time_s, epochs, float(chosen.top1), float(chosen.top5),
                      float(split.data_wait_s), float(split.compute_s), float(split.allreduce_s), list(train.evals))


@dataclass(frozen=True)
class PredictedPoint:
    """The performance model's numbers for one point, beside what was measured."""

    iteration_s: float
    time_to_accuracy_s: float
    measured_iteration_s: float
    measured_time_s: float

    @property
    def iteration_error_pct(self) -> float | None:
        return _error_pct(self.iteration_s, self.measured_iteration_s)

    @property
    def time_error_pct(self) -> float | None:
        return _error_pct(self.time_to_accuracy_s, self.measured_time_s)


def _error_pct(predicted: float, measured: float) -> float | None:
    return (predicted - measured) / measured * 100.0 if measured > 0 else None


@dataclass
class Row:
    """One line of the table: a point's succeeded repeats, aggregated."""

    group: str
    points: list[str]
    baseline: bool
    gpus: int
    nodes: int
    batch: int
    lr: float
    net: str
    runs: list[RunMetrics]
    time_s: Stat
    epochs: Stat
    top1: Stat
    top5: Stat
    data_wait_s: Stat
    compute_s: Stat
    allreduce_s: Stat
    iteration_s: Stat
    not_reached: int                       # repeats with a target that stopped short of it
    speedup: Stat | None = None
    efficiency: Stat | None = None
    delta_top1_pts: Stat | None = None
    parity: Parity | None = None
    prediction: PredictedPoint | None = None


@dataclass
class Summary:
    """Rows, failures and the baseline facts the tables and plots are drawn from."""

    rows: list[Row]
    failures: list[RunRecord]
    tolerance: float
    baseline: Row | None
    baseline_note: str                     # empty when speedup and parity could be computed
    target_accuracy: float | None = None   # a fixed target from the config, else None
    predictions_source: str = ""
    unmatched_predictions: list[str] = field(default_factory=list)


def _row(group: str, members: list[RunRecord], target: float | None = None) -> Row:
    first = members[0]
    metrics = [run_metrics(r, target) for r in members]
    stat = lambda attr: Stat.of([getattr(m, attr) for m in metrics])  # noqa: E731
    return Row(group=group, points=[r.point for r in members], baseline=first.baseline, gpus=first.gpus,
               nodes=first.nodes, batch=first.batch, lr=first.lr, net=first.train.net, runs=metrics,
               time_s=stat("time_s"), epochs=stat("epochs"), top1=stat("top1"), top5=stat("top5"),
               data_wait_s=stat("data_wait_s"), compute_s=stat("compute_s"), allreduce_s=stat("allreduce_s"),
               iteration_s=stat("iteration_s"), not_reached=sum(m.has_target and not m.reached_target for m in metrics))


def summarize(records: list[RunRecord], tolerance: float, *, target_accuracy: float | None = None,
              predictions: dict[str, dict[str, float]] | None = None, predictions_source: str = "") -> Summary:
    """Group repeats, compute speedup and efficiency per repeat against the baseline, judge parity.

    Speedup, efficiency and Δ top-1 are computed for every repeat and then averaged, so their ± is the
    spread over repeats.  The verdict judges the row's mean top-1.
    """
    groups: dict[str, list[RunRecord]] = {}
    failures = []
    for record in sorted(records, key=lambda r: (not r.baseline, r.gpus, r.batch, r.repeat)):
        if record.succeeded:
            groups.setdefault(record.group, []).append(record)
        else:
            failures.append(record)
    rows = []
    for group, members in groups.items():
        target = None
        if members[0].baseline:
            # The sweep's target: a fixed accuracy, or the baseline's final top-1 minus the tolerance.
            final = sum(run_metrics(r).top1 for r in members) / len(members)
            target = target_accuracy if target_accuracy is not None else final - tolerance
        rows.append(_row(group, members, target))
    baseline = next((row for row in rows if row.baseline), None)
    baseline_record = next((r for r in records if r.baseline), None)
    if baseline is not None:
        note = ""
    elif baseline_record is None:
        note = "There is no baseline record, so speedup and parity cannot be computed."
    else:
        why = f": {baseline_record.reason}" if baseline_record.reason else ""
        note = (f"The baseline {'has no record' if baseline_record.outcome == 'missing' else 'failed'}{why}. "
                f"Speedup, scaling efficiency and parity cannot be computed.")
    if baseline is not None:
        base_time, base_top1 = baseline.time_s.mean, baseline.top1.mean
        for row in rows:
            speedups = [base_time / m.time_s for m in row.runs]
            row.speedup = Stat.of(speedups)
            row.efficiency = Stat.of([s / row.gpus for s in speedups])
            row.delta_top1_pts = Stat.of([(m.top1 - base_top1) * 100.0 for m in row.runs])
            if not row.baseline:
                row.parity = check_parity(row.top1.mean, base_top1, tolerance)
    unmatched = []
    if predictions is not None:
        used = set()
        for row in rows:
            key = row.group if row.group in predictions else f"g{row.gpus}-b{row.batch}"
            if key in predictions:
                used.add(key)
                p = predictions[key]
                row.prediction = PredictedPoint(p["iteration_s"], p["time_to_accuracy_s"],
                                                row.iteration_s.mean, row.time_s.mean)
        unmatched = sorted(set(predictions) - used)
    return Summary(rows, failures, tolerance, baseline, note, target_accuracy, predictions_source, unmatched)


def load_predictions(path: str | Path) -> dict[str, dict[str, float]]:
    """Predicted points keyed as the table's rows are ('baseline', 'g{gpus}-b{batch}').

    Reads `firescale predict experiment --json` (points keyed by point name) and
    `firescale predict sweep --json` (a list of points).
    """
    data = load_json(path, "predictions")
    points = data.get("points") if isinstance(data, dict) else None
    if isinstance(points, dict):
        items = [(name, p) for name, p in points.items()]
    elif isinstance(points, list):
        items = [(None, p) for p in points]
    else:
        raise FirescaleError(f"predictions {path}: expected an object with 'points' (from `firescale predict experiment --json`)")
    out: dict[str, dict[str, float]] = {}
    for i, (name, p) in enumerate(items):
        where = f"points[{name!r}]" if name else f"points[{i}]"
        needed = [k for k in ("gpus", "batch", "iteration_s", "time_to_accuracy_s") if not isinstance(p, dict) or k not in p]
        if needed:
            raise FirescaleError(f"predictions {path}: {where} lacks key {needed[0]!r}")
        name = str(name or p.get("point") or f"g{int(p['gpus'])}-b{int(p['batch'])}")
        out[re.sub(r"-r\d+$", "", name)] = {"iteration_s": float(p["iteration_s"]),
                                             "time_to_accuracy_s": float(p["time_to_accuracy_s"])}
    return out


def stat_dict(stat: Stat | None) -> dict[str, Any] | None:
    return None if stat is None else {"mean": stat.mean, "std": stat.std, "n": stat.n}
