"""A stored sweep seen whole: its runs summarized as the report summarizes them (speedup, parity)."""
from __future__ import annotations

from dataclasses import dataclass

from firescale.report.summary import Summary, summarize
from firescale.store.runs import StoredRun

DEFAULT_TOLERANCE = 0.01   # the experiments schema's default target.tolerance, for sweeps stored without one


@dataclass(frozen=True)
class StoredSweep:
    """One sweep's runs and what they show."""

    key: str
    runs: tuple[StoredRun, ...]
    summary: Summary

    @property
    def first(self) -> StoredRun:
        return min(self.runs, key=lambda r: (not r.baseline, r.gpus, r.batch, r.repeat))

    @property
    def finished_at(self) -> str:
        return max(r.finished_at for r in self.runs)

    @property
    def points(self) -> int:
        return len({r.point for r in self.runs})

    @property
    def best_speedup_at_parity(self) -> tuple[float, str] | None:
        """The largest mean speedup among the rows that match the baseline's accuracy, and its row."""
        rows = [r for r in self.summary.rows
                if not r.baseline and r.parity is not None and r.parity.verdict == "MATCHES" and r.speedup]
        if not rows:
            return None
        best = max(rows, key=lambda r: r.speedup.mean if r.speedup else 0.0)
        return (best.speedup.mean if best.speedup else 0.0), best.group


def summarize_runs(runs: list[StoredRun]) -> Summary:
    """The report's summary of stored runs, judged with their sweep's tolerance."""
    tolerance = next((r.tolerance for r in runs if r.tolerance is not None), DEFAULT_TOLERANCE)
    return summarize([r.run_record() for r in runs], tolerance)


def stored_sweeps(runs: list[StoredRun]) -> list[StoredSweep]:
    """The selected runs by sweep, oldest sweep first."""
    by_key: dict[str, list[StoredRun]] = {}
    for run in runs:
        for key in run.sweeps:
            by_key.setdefault(key, []).append(run)
    out = [StoredSweep(key, tuple(members), summarize_runs(members)) for key, members in by_key.items()]
    return sorted(out, key=lambda s: s.finished_at)
