"""Comparing stored runs: two selections point by point, and a sweep against the last one before it."""
from __future__ import annotations

from dataclasses import dataclass

from firescale.errors import FirescaleError
from firescale.report.comparison import Comparison, compare_runs
from firescale.store.database import Store
from firescale.store.runs import StoredRun
from firescale.store.select import Selection, select_runs, sweep_rows


def selected(store: Store, selection: Selection, side: str) -> list[StoredRun]:
    """The runs `selection` names; none is an error naming the selection and the store."""
    found = select_runs(store, selection)
    if not found:
        raise FirescaleError(f"selection {selection.text or '(everything)'} ({side}) matches no runs in "
                             f"{store.name}; `firescale results list` shows what it holds")
    return found


def _one(what: str, a_runs: list[StoredRun], b_runs: list[StoredRun], attr: str) -> None:
    """Refuse sides that hold more than one `what`, or different ones."""
    a_has, b_has = sorted({getattr(r, attr) for r in a_runs}), sorted({getattr(r, attr) for r in b_runs})
    for side, has in (("A", a_has), ("B", b_has)):
        if len(has) > 1:
            raise FirescaleError(f"{side} holds runs of several {what}s ({', '.join(has)}); name one in its "
                                 f"selection ({'experiment=...' if what == 'experiment' else 'commit=... or tag=...'})")
    if a_has and b_has and a_has != b_has:
        raise FirescaleError(f"A and B are different {what}s: A holds {a_has[0]}, B {b_has[0]}; compare runs of "
                             f"one {what}")


def compare_selections(a_runs: list[StoredRun], b_runs: list[StoredRun], *, a_label: str = "A",
                       b_label: str = "B") -> Comparison:
    """A against B point by point, refused when a side is empty or the two hold other experiments or nets."""
    for side, found in (("A", a_runs), ("B", b_runs)):
        if not found:
            raise FirescaleError(f"{side} holds no runs; select some with key=value pairs (site=..., commit=...)")
    _one("experiment", a_runs, b_runs, "experiment")
    _one("net", [r for r in a_runs if r.net], [r for r in b_runs if r.net], "net")
    return compare_runs([r.run_record() for r in a_runs], [r.run_record() for r in b_runs],
                        a_label=a_label, b_label=b_label)


@dataclass(frozen=True)
class EarlierSweep:
    """The last sweep before one, and how its code and versions differ from that one's."""

    key: str
    runs: tuple[StoredRun, ...]
    commit: str
    finished_at: str
    differs: tuple[str, ...]      # 'numpy 1.26.4 -> 2.0.0'


def versions_differ(old: dict[str, str], new: dict[str, str]) -> tuple[str, ...]:
    """'name old -> new' for every version that differs (the commit left to its own line); a version one side
    did not record reads 'not recorded', so that it is not taken for a recorded 'none'."""
    names = sorted((set(old) | set(new)) - {"commit"})
    shown = lambda versions, name: versions.get(name, "not recorded")  # noqa: E731
    return tuple(f"{n} {shown(old, n)} -> {shown(new, n)}" for n in names if old.get(n) != new.get(n))


def _first(runs: list[StoredRun]) -> StoredRun:
    return min(runs, key=lambda r: (not r.baseline, r.gpus, r.batch, r.repeat))


def last_sweep(store: Store, site: str, experiment: str, this_sweep_key: str) -> EarlierSweep | None:
    """The newest sweep of `experiment` on `site` before `this_sweep_key` (by its runs' end, then by when it
    was added) of the same net, with another commit or other versions; None when the store holds none."""
    selection = Selection((("site", site), ("experiment", experiment)), f"site={site},experiment={experiment}")
    rows = {row["sweep_key"]: row for row in sweep_rows(store, selection)}
    this = rows.get(this_sweep_key)
    if this is None:
        return None
    by_sweep: dict[str, list[StoredRun]] = {}
    for run in select_runs(store, selection):
        for key in run.sweeps:
            by_sweep.setdefault(key, []).append(run)
    order = lambda key: (max(r.finished_at for r in by_sweep[key]), rows[key]["id"])  # noqa: E731
    earlier = [key for key in by_sweep if key in rows and order(key) < order(this_sweep_key)
               and rows[key]["net"] == this["net"]
               and (rows[key]["commit"], rows[key]["versions_digest"]) != (this["commit"], this["versions_digest"])]
    if not earlier:
        return None
    key = max(earlier, key=order)
    runs = by_sweep[key]
    return EarlierSweep(key, tuple(runs), rows[key]["commit"], order(key)[0],
                        versions_differ(_first(runs).versions, _first(by_sweep[this_sweep_key]).versions))
