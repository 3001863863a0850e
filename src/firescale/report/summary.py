"""From run records to report rows: per-run metrics, repeats as mean ± std, speedup, parity, predictions."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firescale.atomic import load_json
from firescale.errors import FirescaleError
from firescale.report.hyperparameters import hyperparameters
from firescale.report.parity import Parity, judge_parity
from firescale.report.stats import Interval, mean_ratio
from firescale.results import EvalPoint
from firescale.sweep.points import schedule_from_name
from firescale.sweep.records import RunRecord


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation over repeats (std is None for a single repeat)."""

    mean: float
    std: float | None
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Stat:
        if not values:
            raise ValueError("no values")
        std = statistics.stdev(values) if len(values) > 1 else None
        return cls(statistics.fmean(values), std, len(values))

    def scaled(self, factor: float) -> Stat:
        return Stat(self.mean * factor, None if self.std is None else self.std * factor, self.n)


@dataclass(frozen=True)
class RunMetrics:
    """What one succeeded run contributes to its row."""

    point: str
    has_target: bool
    reached_target: bool
    time_s: float          # train time: its whole fixed-epoch budget (start-up excluded, evaluation included)
    tta_s: float           # time to the target, or the whole train time when it never got there
    epochs: float          # epochs trained
    top1: float            # after the last evaluation
    top5: float
    data_wait_s: float
    compute_s: float
    allreduce_s: float
    evals: list[EvalPoint]
    epochs_to_target: float | None = None
    iterations: int = 0    # iterations trained (all segments)
    eval_s: float = 0.0    # of time_s, evaluating (all segments)

    @property
    def iteration_s(self) -> float:
        return self.data_wait_s + self.compute_s + self.allreduce_s


def run_metrics(record: RunRecord, target: float | None = None) -> RunMetrics:
    """A run's train time and final accuracy, and its time to `target`: its first evaluation at or above it.

    Every run, the baseline included, is timed to the same `target` (the baseline's final top-1 minus
    the tolerance, or a fixed one) from its own evaluations; without one, a run's own time to accuracy
    counts when it had a target.  A run that never got there shows its whole train time there.
    """
    train = record.train
    if train is None or not train.evals:
        raise FirescaleError(f"{record.source}: no evaluations to report")
    final = train.evals[-1]
    hit = None
    if target is not None:
        hit = next((e for e in train.evals if e.top1 >= target), None)
        has_target, reached = True, hit is not None
        tta = float(hit.wall_s) if hit is not None else float(train.train_time_s)
    else:
        has_target = train.target_top1 is not None
        recorded = train.time_to_accuracy_s
        reached = bool(train.reached_target and recorded is not None)
        tta = float(recorded) if reached and recorded is not None else float(train.train_time_s)
        if reached and train.target_top1 is not None:
            hit = next((e for e in train.evals if e.top1 >= train.target_top1), None)
    for name, value in (("train time", float(train.train_time_s)), ("time to accuracy", tta)):
        if value <= 0:
            raise FirescaleError(f"{record.source}: its {name} is {value} s; speedups need a positive time")
    split = train.per_iteration
    return RunMetrics(record.point, has_target, reached, float(train.train_time_s), tta, float(train.epochs),
                      float(final.top1), float(final.top5), float(split.data_wait_s), float(split.compute_s),
                      float(split.allreduce_s), list(train.evals), float(hit.epoch) if hit is not None else None,
                      int(train.iterations), float(sum(s.eval_s for s in train.segments)))


@dataclass(frozen=True)
class PredictedPoint:
    """The performance model's numbers for one point, beside what was measured."""

    iteration_s: float
    time_to_accuracy_s: float
    measured_iteration_s: float
    measured_time_s: float
    parts: dict[str, float] = field(default_factory=dict)   # PREDICTED_PARTS the predictions gave

    @property
    def iteration_error_pct(self) -> float | None:
        return _error_pct(self.iteration_s, self.measured_iteration_s)

    @property
    def time_error_pct(self) -> float | None:
        return _error_pct(self.time_to_accuracy_s, self.measured_time_s)


# A point whose measured iteration lies further than this from its prediction (in percent of the measurement) is
# flagged as a calibration gap: the model, calibrated or not, missed something that point pays.
CALIBRATION_GAP_PCT = 15.0


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
    tta_s: Stat
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
    speedup_interval: Interval | None = None   # of mean baseline time / mean time, over the repeats
    tta_speedup: Stat | None = None            # the same, on time to accuracy
    hyper: dict[str, Any] = field(default_factory=dict)   # the hyperparameters every repeat ran with
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
    calibration_gaps: list[str] = field(default_factory=list)   # what the predictions' calibration did not measure
    uncalibrated: str = ""   # what uncalibrated predictions assumed (uncalibrated_predictions); "": calibrated

    @property
    def calibration_misses(self) -> list[Row]:
        """The rows whose measured iteration is more than CALIBRATION_GAP_PCT off their prediction."""
        return [r for r in self.rows if missed(r)]


def missed(row: Row) -> bool:
    """Whether `row`'s measured iteration lies more than CALIBRATION_GAP_PCT from its prediction."""
    error = row.prediction.iteration_error_pct if row.prediction is not None else None
    return error is not None and abs(error) > CALIBRATION_GAP_PCT


def _net_of(record: RunRecord) -> str:
    """The net a run trained (run_metrics has refused a run without its train record)."""
    if record.train is None:
        raise FirescaleError(f"{record.source}: no evaluations to report")
    return record.train.net


def _row(group: str, members: list[RunRecord], target: float | None = None) -> Row:
    first = members[0]
    metrics = [run_metrics(r, target) for r in members]
    stat = lambda attr: Stat.of([getattr(m, attr) for m in metrics])  # noqa: E731
    return Row(group=group, points=[r.point for r in members], baseline=first.baseline, gpus=first.gpus,
               nodes=first.nodes, batch=first.batch, lr=first.lr, net=_net_of(first), runs=metrics,
               time_s=stat("time_s"), tta_s=stat("tta_s"), epochs=stat("epochs"), top1=stat("top1"), top5=stat("top5"),
               data_wait_s=stat("data_wait_s"), compute_s=stat("compute_s"), allreduce_s=stat("allreduce_s"),
               iteration_s=stat("iteration_s"), not_reached=sum(m.has_target and not m.reached_target for m in metrics),
               hyper=hyperparameters(members))


def _baseline_note(baseline: Row | None, record: RunRecord | None) -> str:
    """Empty when the baseline has a row, else why speedup and parity cannot be computed."""
    if baseline is not None:
        return ""
    if record is None:
        return "There is no baseline record, so speedup and parity cannot be computed."
    why = f": {record.reason}" if record.reason else ""
    return (f"The baseline {'has no record' if record.outcome == 'missing' else 'failed'}{why}. "
            f"Speedup, scaling efficiency and parity cannot be computed.")


def summarize(records: list[RunRecord], tolerance: float, *, target_accuracy: float | None = None,
              predictions: dict[str, dict[str, float]] | None = None, predictions_source: str = "",
              calibration_gaps: list[str] | None = None, uncalibrated: str = "") -> Summary:
    """Group repeats, compute speedup and efficiency per repeat against the baseline, judge parity.

    Speedup, efficiency and Δ top-1 are computed for every repeat and then averaged, so their ± is the
    spread over repeats; the speedup's interval is that of the ratio of mean times.  The verdict tests
    the repeats' Δ top-1 against the tolerance (parity.judge_parity).
    """
    groups: dict[str, list[RunRecord]] = {}
    failures = []
    for record in sorted(records, key=lambda r: (not r.baseline, r.gpus, r.batch, r.lr, r.repeat)):
        if record.succeeded:
            groups.setdefault(record.group, []).append(record)
        else:
            failures.append(record)
    target = target_accuracy
    if target is None and "baseline" in groups:
        # The sweep's target: the baseline's mean final top-1 minus the tolerance.
        target = statistics.fmean(run_metrics(r).top1 for r in groups["baseline"]) - tolerance
    rows = [_row(group, members, target) for group, members in groups.items()]
    baseline = next((row for row in rows if row.baseline), None)
    note = _baseline_note(baseline, next((r for r in records if r.baseline), None))
    if baseline is not None:
        base_time, base_top1 = baseline.time_s.mean, baseline.top1.mean
        for row in rows:
            speedups = [base_time / m.time_s for m in row.runs]
            row.speedup = Stat.of(speedups)
            row.efficiency = Stat.of([s / row.gpus for s in speedups])
            row.delta_top1_pts = Stat.of([(m.top1 - base_top1) * 100.0 for m in row.runs])
            row.speedup_interval = mean_ratio([m.time_s for m in baseline.runs], [m.time_s for m in row.runs])
            row.tta_speedup = Stat.of([baseline.tta_s.mean / m.tta_s for m in row.runs])
            if not row.baseline:
                row.parity = judge_parity([m.top1 for m in row.runs], [m.top1 for m in baseline.runs], tolerance)
    unmatched = []
    if predictions is not None:
        used = set()
        for row in rows:
            plain = not schedule_from_name(row.points[0])   # a scheduled row never takes a plain point's
            key = row.group if row.group in predictions or not plain else f"g{row.gpus}-b{row.batch}"
            if key in predictions:
                used.add(key)
                p = predictions[key]
                row.prediction = PredictedPoint(p["iteration_s"], p["time_to_accuracy_s"],
                                                row.iteration_s.mean, row.time_s.mean,
                                                {k: p[k] for k in PREDICTED_PARTS if k in p})
        unmatched = sorted(set(predictions) - used)
    return Summary(rows, failures, tolerance, baseline, note, target_accuracy, predictions_source, unmatched,
                   list(calibration_gaps or []), uncalibrated)


# The parts of a predicted iteration that `predict experiment` gives beside it: the allreduce's intra- and
# inter-node steps, reading the batch and copying it to the device (seconds).
PREDICTED_PARTS = ("comm_intra_s", "comm_inter_s", "io_s", "h2d_s")


def unmeasured_in_calibration(data: Any) -> list[str]:
    """What the calibration behind predictions (`firescale predict experiment --json`, as read by
    `read_predictions`) left unmeasured, in words: the link (its factor left at the peak), the fixed cost of an
    iteration (one batch size measured), where a point puts several ranks on a node, their contention, and for a
    PyTorch experiment, the allreduce of its runs' process group where the probe timed another's.  Empty for
    predictions without a calibration."""
    cal = data.get("calibration") if isinstance(data, dict) else None
    if not isinstance(cal, dict):
        return []
    comm, compute = cal.get("comm_source") or {}, cal.get("compute_source") or {}
    points = data.get("points") if isinstance(data.get("points"), dict) else {}
    shared = any(isinstance(p, dict) and int(p.get("gpus", 1)) > int(p.get("nodes", 1)) for p in points.values())
    gaps = []
    if not comm.get("fitted"):
        gaps.append("the link (its factor left at the peak)")
    if compute.get("overhead_fitted") is False:
        gaps.append("the fixed cost of an iteration (one batch size measured)")
    if shared and "contention" not in compute and float(cal.get("contention", 1.0)) == 1.0:
        gaps.append("how much a node's ranks slow each other (taken as not at all)")
    probed, runs = comm.get("process_group"), data.get("process_group")
    if comm.get("fitted") and runs and probed and probed != runs:
        gaps.append(f"the allreduce of the {runs} process group the runs sum over (it timed {probed}'s)")
    return gaps


# How the report words where an uncalibrated percent of peak came from (predict.experiment.percent_of_peak).
_PEAK_SOURCES = {"peak": "", "given": " as given", "layer profile": " for the layers the site's profile lacks"}


def uncalibrated_predictions(data: Any) -> str:
    """What predictions made without a calibration (`firescale predict experiment --json` with `calibrated` false,
    as an experiment with `calibrate: false` has them) assumed, in words ("compute at 1 of the device's peak and
    links at 1 of the link's"); empty for calibrated ones and for a file that does not say (`predict sweep`)."""
    if not isinstance(data, dict) or data.get("calibrated") is not False:
        return ""
    given = data.get("percent_of_peak")
    ppp = given if isinstance(given, dict) else {}
    parts = [f"{what} at {float(ppp[key]):.3g} of {whose}{_PEAK_SOURCES.get(str(ppp.get(f'{key}_source')), '')}"
             for key, what, whose in (("compute", "compute", "the device's peak"), ("comm", "links", "the link's"))
             if isinstance(ppp.get(key), (int, float))]
    return " and ".join(parts) or "the model's own percents of peak"


def read_predictions(path: str | Path) -> Any:
    """A predictions file, read once for `predicted_points` and `unmeasured_in_calibration`."""
    return load_json(path, "predictions")


def load_predictions(path: str | Path) -> dict[str, dict[str, float]]:
    """The predicted points of the file at `path` (`predicted_points`)."""
    return predicted_points(read_predictions(path), path)


def predicted_points(data: Any, path: str | Path) -> dict[str, dict[str, float]]:
    """Predicted points keyed as the table's rows are ('baseline', 'g{gpus}-b{batch}'), from the content of
    `path`: `firescale predict experiment --json` (points keyed by point name) or `firescale predict sweep
    --json` (a list of points).
    """
    points = data.get("points") if isinstance(data, dict) else None
    if isinstance(points, dict):
        items = [(name, p) for name, p in points.items()]
    elif isinstance(points, list):
        items = [(None, p) for p in points]
    else:
        raise FirescaleError(f"predictions {path}: expected an object with 'points' "
                             f"(from `firescale predict experiment --json`)")
    out: dict[str, dict[str, float]] = {}
    for i, (name, p) in enumerate(items):
        where = f"points[{name!r}]" if name else f"points[{i}]"
        needed = [k for k in ("gpus", "batch", "iteration_s", "time_to_accuracy_s")
                  if not isinstance(p, dict) or k not in p]
        if needed:
            raise FirescaleError(f"predictions {path}: {where} lacks key {needed[0]!r}")
        name = str(name or p.get("point") or f"g{int(p['gpus'])}-b{int(p['batch'])}")
        out[re.sub(r"-r\d+$", "", name)] = {"iteration_s": float(p["iteration_s"]),
                                             "time_to_accuracy_s": float(p["time_to_accuracy_s"]),
                                             **{k: float(p[k]) for k in PREDICTED_PARTS if k in p}}
    return out


def stat_dict(stat: Stat | None) -> dict[str, Any] | None:
    return None if stat is None else {"mean": stat.mean, "std": stat.std, "n": stat.n}
