"""Where a point's train time beyond the ideal went: its seconds in compute, the allreduce, waiting for data,
evaluation and the rest, each against the baseline's seconds in it shared over the point's GPUs.

The ideal of a point on G GPUs is the baseline's train time times the point's epochs over the baseline's,
over G.  A part's cost is the point's seconds in that part minus the baseline's seconds in it scaled the same
way; the parts add up to the time beyond the ideal.  Compute beyond the ideal is the ranks slowing each other
(and a batch per rank other than the baseline's); the allreduce's includes each rank's wait for the slowest.
"""
from __future__ import annotations

import statistics

from firescale.report.summary import Row, RunMetrics

PARTS = ("compute", "allreduce", "data wait", "evaluation", "the rest")


def part_seconds(run: RunMetrics) -> dict[str, float]:
    """One run's train time in PARTS: its iterations' means times their count, evaluation, and what is left
    (the loop's own work and the spread of iterations about their mean)."""
    steps = {"compute": run.compute_s, "allreduce": run.allreduce_s, "data wait": run.data_wait_s}
    out = {name: run.iterations * seconds for name, seconds in steps.items()}
    out["evaluation"] = run.eval_s
    out["the rest"] = run.time_s - run.eval_s - run.iterations * run.iteration_s
    return out


def _mean_parts(row: Row) -> dict[str, float]:
    per_run = [part_seconds(run) for run in row.runs]
    return {name: statistics.fmean(p[name] for p in per_run) for name in PARTS}


def beyond_ideal(row: Row, baseline: Row) -> tuple[float, dict[str, float]]:
    """The ideal train time of `row` and, per part, its seconds beyond the baseline's share (mean of repeats)."""
    share = row.epochs.mean / baseline.epochs.mean / row.gpus
    ours, theirs = _mean_parts(row), _mean_parts(baseline)
    return baseline.time_s.mean * share, {name: ours[name] - share * theirs[name] for name in PARTS}
