"""The report's tables beside the main one: intervals and predictions, against the last sweep, time beyond the
ideal, the LR search and every hyperparameter (FireCaffe 7.1)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from firescale.report import formatting as cells
from firescale.report.beyond_ideal import PARTS, beyond_ideal
from firescale.report.comparison import Comparison, LastSweep, PointComparison
from firescale.report.formatting import ReportContext
from firescale.report.summary import Row, Summary

DASH = cells.DASH


@dataclass(frozen=True)
class Section:
    """A titled table with the sentences under it, rendered alike in Markdown, LaTeX and HTML."""

    title: str
    heads: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    marked: list[bool] = field(default_factory=list)   # rows to emphasise (the chosen rate)
    intro: list[str] = field(default_factory=list)     # sentences before the table

    def to_dict(self) -> dict[str, Any]:
        out = {"title": self.title, "heads": self.heads, "rows": self.rows, "notes": self.notes,
               "marked": self.marked}
        return {**out, "intro": self.intro} if self.intro else out


def detail_section(summary: Summary) -> Section:
    """The second table, right under the main one: each point's intervals, efficiency and time to accuracy, and
    its prediction beside the measurement (formatting.detail_table)."""
    heads, body = cells.detail_table(summary)
    return Section(cells.detail_title(summary), heads, body, cells.detail_notes(summary))


def hyperparameter_section(summary: Summary) -> Section | None:
    """Settings shared by every row as notes, the rest as a table with one line per row."""
    rows = [r for r in summary.rows if r.hyper]
    if not rows:
        return None
    keys = list(rows[0].hyper)
    varying = [k for k in keys if len({r.hyper.get(k) for r in rows}) > 1]
    common = [f"{k}: {rows[0].hyper[k]}" for k in keys if k not in varying and rows[0].hyper[k] != DASH]
    body = [[r.group, *(r.hyper.get(k, DASH) for k in varying)] for r in rows]
    return Section("Hyperparameters", ["Point", *varying], body if varying else [],
                   ["Every run: " + "; ".join(common) + "."] if common else [])


def _search_groups(summary: Summary) -> dict[tuple[int, int], list[Row]]:
    groups: dict[tuple[int, int], list[Row]] = {}
    for row in summary.rows:
        if not row.baseline:
            groups.setdefault((row.gpus, row.batch), []).append(row)
    return {k: sorted(v, key=lambda r: r.lr) for k, v in groups.items() if len({r.lr for r in v}) > 1}


def chosen_rate(rows: list[Row]) -> Row | None:
    """FireCaffe's choice: of the rates whose runs match the baseline, the one that gets to the target
    accuracy first (at one GPU count and batch every rate trains the same epochs)."""
    matching = [r for r in rows if r.parity is not None and r.parity.matches]
    return min(matching, key=lambda r: (r.not_reached, r.tta_s.mean)) if matching else None


def lr_search_sections(summary: Summary) -> list[Section]:
    """One table per GPUs x batch trained at several rates: final top-1/top-5, time, verdict, the choice."""
    out = []
    for (gpus, batch), rows in _search_groups(summary).items():
        best = chosen_rate(rows)
        body = [[f"{r.lr:g}", cells.percent(r.top1), cells.percent(r.top5), cells.duration(r.time_s),
                 cells.duration(r.tta_s) + (cells.NOT_REACHED if r.not_reached else ""), cells.speedup(r.speedup),
                 r.parity.verdict if r.parity else DASH, "◀ chosen" if r is best else ""] for r in rows]
        failed = [f for f in summary.failures if (f.gpus, f.batch) == (gpus, batch)]
        body += [[f"{f.lr:g}", DASH, DASH, cells.failure_word(f), DASH, DASH, cells.failure_text(f), ""]
                 for f in failed]
        verdict = (f"Chosen: LR {best.lr:g}, the rate that matches the baseline and reaches the target first."
                   if best else "No rate matches the baseline: none is chosen.")
        out.append(Section(f"Learning-rate search: {gpus} GPUs, batch {batch}",
                           ["Initial LR", "Top-1 (final)", "Top-5 (final)", "Train time", "Time to accuracy",
                            "Speedup", "Parity", ""],
                           body, [verdict, "FireCaffe 7.3 searched GoogLeNet's rate this way at batch 1024 and "
                                  "chose 0.08, the rate that matched the baseline's accuracy."],
                           [r is best for r in rows] + [False] * len(failed)))
    return out


def _cell(seconds: float, whole: float) -> str:
    share = f" ({seconds / whole * 100:.0f}%)" if whole > 0 else ""
    return f"{cells.signed_seconds(seconds)}{share}"


def beyond_ideal_section(summary: Summary) -> Section | None:
    """One line per point on more than one GPU: ideal, measured, beyond, and the parts of the difference."""
    base = summary.baseline
    rows = [r for r in summary.rows if not r.baseline and r.gpus > 1]
    if base is None or not rows or any(run.iterations <= 0 for r in [base, *rows] for run in r.runs):
        return None
    body = []
    for row in rows:
        ideal, parts = beyond_ideal(row, base)
        beyond = row.time_s.mean - ideal
        body.append([row.group, cells.duration_value(ideal), cells.duration_value(row.time_s.mean),
                     _cell(beyond, beyond), *(_cell(parts[name], beyond) for name in PARTS)])
    return Section("Time beyond the ideal", ["Point", "Ideal", "Train time", "Beyond ideal",
                                             *(p[0].upper() + p[1:] for p in PARTS)], body,
                   ["Ideal: the baseline's train time over the point's GPUs (for the point's epochs). Each part is "
                    "the point's seconds in it minus the baseline's seconds in it shared the same way (means of the "
                    "repeats), in percent of the time beyond the ideal; the parts add up to it.",
                    "Compute beyond the ideal is the ranks slowing each other on shared cores, memory or links, and a "
                    "batch per rank other than the baseline's; the allreduce's includes each rank's wait for the "
                    "slowest; the rest is the loop's own work and the spread of iterations about their mean. "
                    "Start-up is outside every train time."])


def _ms(seconds: float | None) -> str:
    return DASH if seconds is None else f"{seconds * 1e3:.2f} ms"


def _signed_ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.2f}".replace("-", cells.MINUS)


def _both(point: PointComparison, measure: str, show: Callable[[float], str]) -> str:
    return " / ".join(DASH if v is None else show(v) for v in (point.a.mean(measure), point.b.mean(measure)))


def _iteration_change(point: PointComparison) -> str:
    """'+1.30 ms [+0.80, +1.80] (+20.0%)': B − A, its interval, and in percent of A."""
    d = point.diff("iteration_s")
    if d is None:
        return DASH
    interval = "" if d.interval is None else f" [{_signed_ms(d.interval.low)}, {_signed_ms(d.interval.high)}]"
    return f"{_signed_ms(d.value)} ms{interval} ({cells.error_pct(point.iteration_pct)})"


def _comparison_rows(comparison: Comparison) -> list[list[str]]:
    return [[p.point, f"{p.a.n}/{p.b.n}", _ms(p.a.mean("iteration_s")), _ms(p.b.mean("iteration_s")),
             _iteration_change(p), cells.duration_pair(p.a.mean("train_time_s"), p.b.mean("train_time_s")),
             _both(p, "speedup", lambda v: f"{v:.2f}×"), _both(p, "top1", lambda v: f"{v * 100:.1f}%"), p.verdict]
            for p in comparison.points]


def _which(ctx: ReportContext, last: LastSweep) -> str:
    versions = ("Versions that differ: " + ", ".join(d.replace(" -> ", " → ") for d in last.differs) + "."
                if last.differs else "The same versions; the commit differs.")
    this = f" (this sweep: {last.this_commit[:12]})" if last.this_commit else ""
    return (f"Against the store's last sweep of {ctx.experiment} on {ctx.site} before this one: commit "
            f"{last.commit[:12]}{this}, finished {last.finished_at}. {versions}")


def last_sweep_section(ctx: ReportContext, last: LastSweep) -> Section:
    """One line per point of this sweep (B) against the last one before it (A): iteration, train time,
    speedup and top-1 of each, and the verdict on the iteration."""
    c = last.comparison
    failed = [f"{', '.join(names)} ({side})" for side, names in (("the earlier sweep", c.a_failed),
                                                                  ("this one", c.b_failed)) if names]
    return Section("Against the last sweep",
                   ["Point", "n A/B", "Iteration A", "Iteration B", f"Δ iteration ({cells.CI})", "Train time A/B",
                    "Speedup A/B", "Top-1 A/B", "Verdict"], _comparison_rows(c),
                   ["A is the earlier sweep, B this one; each side's numbers are the means of the point's succeeded "
                    "runs, speedups against that side's own baseline.  Δ iteration is B − A with Welch's "
                    f"{cells.CI} and in percent of A: slower (faster) when the interval lies wholly above (below) "
                    "0, no difference when it holds 0, too few repeats with fewer than two runs on either side.",
                    *([f"Failed, so left out: {'; '.join(failed)}."] if failed else [])],
                   intro=[_which(ctx, last)])


def sections(summary: Summary, ctx: ReportContext | None = None) -> list[Section]:
    """Every section after the main table and its second (detail_section), in the order the report shows them."""
    hyper, beyond = hyperparameter_section(summary), beyond_ideal_section(summary)
    last = None if ctx is None or ctx.against_last is None else last_sweep_section(ctx, ctx.against_last)
    return [*([last] if last else []), *([beyond] if beyond else []), *lr_search_sections(summary),
            *([hyper] if hyper else [])]
