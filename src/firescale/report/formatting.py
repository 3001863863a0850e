"""The table's cells as plain Unicode text: one formatting for Markdown, LaTeX and HTML alike."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from firescale.frameworks import DEFAULT_FRAMEWORK, DEFAULT_PRECISION
from firescale.report.comparison import LastSweep
from firescale.report.parity import Parity
from firescale.report.stats import LEVEL, Interval
from firescale.report.summary import CALIBRATION_GAP_PCT, Row, Stat, Summary, missed
from firescale.sweep.points import batch_label
from firescale.sweep.records import RunRecord

NOT_REACHED = "†"
CALIBRATION_GAP = "‡"   # a measured iteration more than CALIBRATION_GAP_PCT off its prediction
CI = f"{LEVEL:.0%} CI"
# Columns that hold numbers: right-aligned in every format.
NUMERIC = {"Epochs", "Batch", "Initial LR", "Train time", "Speedup", f"Speedup {CI}", "Efficiency",
           "Time to accuracy", "Top-1",
           "Top-5", "Δ top-1", f"Δ top-1 {CI}", "Iter. measured", "Iter. predicted", "Iter. error",
           "Time predicted", "Time error"}
DASH = "—"
MINUS = "−"


@dataclass(frozen=True)
class ReportContext:
    """What the report says about where it ran: site, device, experiment and its settings."""

    experiment: str
    site: str
    device: str
    net: str
    site_digest: str = ""
    site_source: str = ""
    description: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)
    # the experiment's backend and precision, named in Hardware when not the defaults
    framework: str = DEFAULT_FRAMEWORK
    precision: str = DEFAULT_PRECISION
    against_last: LastSweep | None = None   # this sweep against the store's last one before it (`--store`)
    figures_beside: tuple[str, ...] = ()    # stems of the figures written beside the report's own (memory_plots)


def _unit(seconds: float) -> tuple[float, str]:
    if seconds >= 2 * 86400:
        return 86400.0, "days"
    if seconds >= 2 * 3600:
        return 3600.0, "h"
    if seconds >= 120:
        return 60.0, "min"
    return 1.0, "s"


def _num(value: float, digits: int) -> str:
    return f"{value:.{digits}f}"


def _pm(stat: Stat, scale: float, digits: int, suffix: str, signed: bool = False) -> str:
    value = round(stat.mean * scale, digits) + 0.0  # + 0.0 turns -0.0 into 0.0
    mean = _signed(value, digits) if signed else _num(value, digits)
    if stat.std is None:
        return f"{mean}{suffix}"
    return f"{mean} ± {_num(stat.std * scale, digits)}{suffix}"


def _signed(value: float, digits: int) -> str:
    """'+1.0' or '−1.0' with a true minus sign (U+2212), as typeset tables print it."""
    return f"{value:+.{digits}f}".replace("-", MINUS)


def duration(stat: Stat) -> str:
    """Seconds in a readable unit, the ± in the same unit: '50.0 ± 14.1 s', '11.0 h'."""
    div, unit = _unit(stat.mean)
    digits = 2 if stat.mean / div < 10 else 1
    return _pm(stat, 1.0 / div, digits, f" {unit}")


def duration_value(seconds: float) -> str:
    return duration(Stat(seconds, None, 1))


def duration_pair(first: float | None, second: float | None) -> str:
    """Two durations in the unit of the longer: '100.3 s / 121.2 s', a dash for a missing one."""
    div, unit = _unit(max(v for v in (first, second, 0.0) if v is not None))
    shown = [DASH if v is None else f"{v / div:.{2 if max(first or 0, second or 0) / div < 10 else 1}f} {unit}"
             for v in (first, second)]
    return " / ".join(shown)


def signed_seconds(seconds: float) -> str:
    """A difference of times, signed, in a readable unit: '+4.2 s', '−350 ms'."""
    if abs(seconds) < 1.0:
        return f"{_signed(seconds * 1e3, 0)} ms"
    div, unit = _unit(abs(seconds))
    return f"{_signed(seconds / div, 1)} {unit}"


def percent(stat: Stat) -> str:
    """An accuracy (a fraction) in percent with one decimal: '95.3 ± 0.4%'."""
    return _pm(stat, 100.0, 1, "%")


def speedup(stat: Stat | None) -> str:
    return DASH if stat is None else _pm(stat, 1.0, 2, "×")


def efficiency(stat: Stat | None) -> str:
    return DASH if stat is None else _pm(stat, 100.0, 1, "%")


def delta_pts(stat: Stat | None) -> str:
    return DASH if stat is None else _pm(stat, 1.0, 1, " pts", signed=True)


def speedup_interval(interval: Interval | None) -> str:
    """'1.71–2.10×', or a dash without repeats on both sides."""
    return DASH if interval is None else f"{_num(interval.low, 2)}–{_num(interval.high, 2)}×"


def delta_interval(parity: Parity | None) -> str:
    """The interval of Δ top-1 in points, '[−1.2, +0.8] pts', or a dash without one."""
    if parity is None or parity.interval is None:
        return DASH
    low, high = (_signed(round(v * 100.0, 1) + 0.0, 1) for v in (parity.interval.low, parity.interval.high))
    return f"[{low}, {high}] pts"


def epochs(stat: Stat) -> str:
    digits = 2 if stat.mean < 10 else 1 if stat.mean < 100 else 0
    return _pm(stat, 1.0, digits, "")


def error_pct(value: float | None) -> str:
    return DASH if value is None else _signed(round(value, 1) + 0.0, 1) + "%"


def hardware(ctx: ReportContext, gpus: int, nodes: int) -> str:
    """'8 × K20 (titan, 2 nodes)', with the framework and precision after it where they are not the defaults
    (TensorFlow in fp32):
    '8 × H200 (h200, 1 node; pytorch, bf16)'."""
    defaults = (ctx.framework, ctx.precision) == (DEFAULT_FRAMEWORK, DEFAULT_PRECISION)
    stack = "" if defaults else f"; {ctx.framework}, {ctx.precision}"
    return f"{gpus} × {ctx.device} ({ctx.site}, {nodes} node{'s' if nodes != 1 else ''}{stack})"


def columns(summary: Summary) -> list[str]:
    """The main table's headings: FireCaffe's Table 2 (hardware, net, epochs, batch, initial LR, train time,
    speedup, top-1, top-5) between the point's name and its parity verdict."""
    return ["Point", "Hardware", "Net", "Epochs", "Batch", "Initial LR", "Train time", "Speedup", "Top-1", "Top-5",
            "Parity"]


def detail_columns(summary: Summary) -> list[str]:
    """The second table's headings: the intervals, efficiency and time to accuracy, and the predictions (with
    predictions only)."""
    heads = ["Point", f"Speedup {CI}", "Efficiency", "Time to accuracy", "Δ top-1", f"Δ top-1 {CI}"]
    if summary.predictions_source:
        heads += ["Iter. measured", "Iter. predicted", "Iter. error", "Time predicted", "Time error"]
    return heads


def _name(row: Row) -> str:
    return row.group if len(row.points) == 1 else f"{row.group} ({len(row.points)} repeats)"


def row_cells(row: Row, summary: Summary, ctx: ReportContext) -> list[str]:
    """A point's line of the main table."""
    if row.baseline:
        verdict = "baseline"
    elif row.parity is None:
        verdict = "cannot judge: no baseline"
    else:
        verdict = row.parity.verdict
    return [_name(row), hardware(ctx, row.gpus, row.nodes), row.net, epochs(row.epochs),
            batch_label(row.points[0], row.batch), f"{row.lr:g}", duration(row.time_s), speedup(row.speedup),
            percent(row.top1), percent(row.top5), verdict]


def detail_cells(row: Row, summary: Summary) -> list[str]:
    """A point's line of the second table: intervals, efficiency, time to accuracy, and its prediction."""
    tta = duration(row.tta_s) + (NOT_REACHED if row.not_reached else "")
    cells = [_name(row), DASH if row.baseline else speedup_interval(row.speedup_interval), efficiency(row.efficiency),
             tta, DASH if row.baseline else delta_pts(row.delta_top1_pts), delta_interval(row.parity)]
    if summary.predictions_source:
        cells += prediction_cells(row)
    return cells


def prediction_cells(row: Row) -> list[str]:
    """Iteration measured (mean ± sd of the repeats) and predicted, its error, the predicted time and its error."""
    p = row.prediction
    measured = _pm(row.iteration_s, 1e3, 2, " ms")   # the repeats' spread beside their mean
    if p is None:
        return [measured, DASH, DASH, DASH, DASH]
    return [measured, _ms(p.iteration_s), error_pct(p.iteration_error_pct) + (CALIBRATION_GAP if missed(row) else ""),
            duration_value(p.time_to_accuracy_s), error_pct(p.time_error_pct)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def failure_word(record: RunRecord) -> str:
    return "MISSING" if record.outcome == "missing" else "FAILED"


def failure_text(record: RunRecord) -> str:
    """'FAILED: why (scheduler: TIMEOUT → FAILED, exit 1)' on one line."""
    states = " → ".join(record.scheduler_states)
    extra = [f"scheduler: {states}"] if states else []
    if record.exit_code is not None:
        extra.append(f"exit {record.exit_code}")
    reason = " ".join(record.reason.split()) or "no reason recorded"
    return f"{failure_word(record)}: {reason}" + (f" ({', '.join(extra)})" if extra else "")


def failure_cells(record: RunRecord, summary: Summary, ctx: ReportContext, *, brief: bool = False) -> list[str]:
    """A failed or missing point's row; `brief` keeps only the word (LaTeX puts the reason in a note)."""
    verdict = failure_word(record) if brief else failure_text(record)
    return [record.point, hardware(ctx, record.gpus, record.nodes), ctx.net, DASH,
            batch_label(record.point, record.batch), f"{record.lr:g}", failure_word(record), DASH, DASH, DASH,
            verdict]


def table(summary: Summary, ctx: ReportContext, *,
          brief: bool = False) -> tuple[list[str], list[list[str]], list[bool]]:
    """The main table: headings, cell rows (aggregated points first, then failures) and which rows are failures."""
    body = [row_cells(r, summary, ctx) for r in summary.rows]
    body += [failure_cells(f, summary, ctx, brief=brief) for f in summary.failures]
    return columns(summary), body, [False] * len(summary.rows) + [True] * len(summary.failures)


def detail_title(summary: Summary) -> str:
    if not summary.predictions_source:
        return "Intervals"
    return "Intervals and uncalibrated predictions" if summary.uncalibrated else "Intervals and predictions"


def detail_table(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """The second table: headings and one row per aggregated point (a failed point has nothing to show there)."""
    return detail_columns(summary), [detail_cells(r, summary) for r in summary.rows]


def notes(summary: Summary, ctx: ReportContext) -> list[str]:
    """The sentences under the main table: the baseline's state, parity, train time, speedup, data wait."""
    tol = summary.tolerance * 100.0
    out = []
    if summary.baseline_note:
        out.append(summary.baseline_note)
    out.append(f"Parity (FireCaffe 7.1: accuracy against a single-GPU baseline) is a non-inferiority test on "
               f"the final top-1 after each run's fixed-epoch budget: with two or more runs of the point and of "
               f"the baseline, the point MATCHES when the lower end of the {LEVEL:.0%} confidence interval of "
               f"Δ top-1 (Welch's t) is at least −{tol:g} pts, is BELOW BASELINE when its upper end is under "
               f"−{tol:g} pts, and UNDECIDED otherwise (more repeats narrow the interval); with one run on either "
               f"side, when its mean top-1 is at least the baseline's minus {tol:g} pts.")
    out.append("Train time is each run's whole fixed-epoch budget (FireCaffe's train time; start-up excluded, "
               "evaluation included); epochs are those trained.  Speedup = baseline train time / this train time; "
               "repeats give mean ± sample standard deviation, computed per repeat.")
    waits = [(r.group, r.data_wait_s.mean / r.iteration_s.mean) for r in summary.rows if r.iteration_s.mean > 0]
    if waits:
        each = ", ".join(f"{group} {share * 100:.1f}%" for group, share in waits)
        out.append(f"Waiting for data, in percent of each point's mean iteration as its runs recorded it: {each}; "
                   f"the rest is compute and the allreduce (figure time_split).")
    return out


def detail_notes(summary: Summary) -> list[str]:
    """The sentences under the second table: the intervals, time to accuracy and its mark, the predictions."""
    tol, level = summary.tolerance * 100.0, f"{LEVEL:.0%}"
    target = (f"the fixed target top-1 ≥ {summary.target_accuracy * 100:g}%" if summary.target_accuracy is not None
              else f"the baseline's mean final top-1 minus {tol:g} pts")
    out = [f"The speedup's interval is that of mean baseline time / mean time ({level}, the delta method on its "
           f"logarithm with Welch's degrees of freedom); efficiency = speedup / GPUs, per repeat.  Time to accuracy "
           f"is the time to {target}, read from each run's own evaluations, the baseline included (MLPerf's "
           f"measure).  Δ top-1 is the point's final top-1 less the baseline's, with Welch's {level} interval when "
           f"both have two runs or more."]
    if any(r.not_reached for r in summary.rows):
        out.append(f"{NOT_REACHED} the target was not reached in at least one repeat: its whole train time is "
                   f"counted as its time to accuracy.")
    if summary.predictions_source:
        out.append(f"Predictions from {summary.predictions_source}; error = (predicted − measured) / measured, "
                   "against the mean of the point's repeats; Iter. measured gives their mean iteration ± sd, the "
                   "spread that runs of one command show from their own luck.")
        if summary.uncalibrated:
            out.append(f"The predictions are uncalibrated: nothing measured on the site fitted the model, which took "
                       f"{summary.uncalibrated} (the experiment sets calibrate: false, or they were made without "
                       "--calibration): their errors are the uncalibrated model's.")
        if summary.calibration_gaps:
            out.append("The calibration behind the predictions did not measure " + _or(summary.calibration_gaps)
                       + ", so points of smaller per-rank batches or of several ranks a node may take longer than "
                       "predicted.")
        if summary.calibration_misses:
            out.append(calibration_gap_note(summary))
        if summary.unmatched_predictions:
            out.append("Predicted points without a measured row: " + ", ".join(summary.unmatched_predictions) + ".")
    return out


def calibration_gap_note(summary: Summary) -> str:
    """The sentence under the second table for its points marked CALIBRATION_GAP: each one's predicted and
    measured iteration, and what a gap means."""
    each = ", ".join(f"{r.group} {error_pct(r.prediction.iteration_error_pct)} ({_ms(r.prediction.iteration_s)} "
                     f"predicted, {_ms(r.iteration_s.mean)} measured)"
                     for r in summary.calibration_misses if r.prediction is not None)
    what = ("the calibration did not capture something these points pay (compare the prediction's parts, comm "
            "intra + inter and I/O, with the runs' allreduce and data wait)" if not summary.uncalibrated else
            "the predictions are uncalibrated: calibrate on the site (the workflow's calibration job) before "
            "reading the model's numbers")
    return (f"{CALIBRATION_GAP} Calibration gap: the measured iteration lies more than {CALIBRATION_GAP_PCT:g}% from "
            f"the prediction at {each}; {what}.")


def _or(items: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]

