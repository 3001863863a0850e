"""The cross-site paper table: one experiment's newest sweep on each site, beside published rows."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from firescale.errors import FirescaleError
from firescale.report import formatting as cells
from firescale.report.parity import judge_parity
from firescale.report.summary import Row, Stat
from firescale.store.database import Store
from firescale.store.reference import ReferenceRow
from firescale.store.runs import StoredRun
from firescale.store.select import Selection, select_runs
from firescale.store.sweeps import StoredSweep, stored_sweeps
from firescale.sweep.points import batch_label
from firescale.sweep.records import RunRecord

MEASURED, FAILED, PUBLISHED = "measured", "failed", "published"


@dataclass(frozen=True)
class TableRow:
    """One line of the table: a measured point (repeats aggregated), a failed one, or a published row."""

    kind: str
    site: str
    device: str
    gpus: int | None
    nodes: int | None
    framework: str
    precision: str
    net: str
    batch: str
    lr: float | None
    epochs: Stat | None
    time_s: Stat | None
    speedup: Stat | None
    top1: Stat | None
    top5: Stat | None
    verdict: str
    against: str          # what the speedup is against: "vcluster's baseline", "as published"
    source: str           # 'measured', or the publication a published row is from
    sweep: str = ""
    commit: str = ""

    @property
    def hardware(self) -> str:
        """'2 × x86-64 CPU core (float32), 1 node'; a published row's count and device as printed."""
        if self.gpus is None:
            return self.device
        nodes = "" if self.nodes is None else f", {self.nodes} node{'s' if self.nodes != 1 else ''}"
        return f"{self.gpus} × {self.device or 'unknown device'}{nodes}"

    @property
    def repeats(self) -> int:
        return self.time_s.n if self.time_s is not None and self.kind == MEASURED else 0


@dataclass(frozen=True)
class Baseline:
    """The baseline the speedups and parity of some rows are taken against."""

    site: str
    row: Row
    device: str

    def describe(self) -> str:
        return (f"{self.row.gpus} × {self.device or 'unknown device'}, batch {self.row.batch}, "
                f"train time {cells.duration_value(self.row.time_s.mean)}")


@dataclass(frozen=True)
class CrossSiteTable:
    """The table of one experiment: its rows, caption and notes, and the sweeps it was drawn from."""

    experiment: str
    sites: tuple[str, ...]
    rows: list[TableRow]
    caption: str
    notes: list[str] = field(default_factory=list)


def read_runs(stores: Iterable[Store], experiment: str, narrow: Selection | None = None) -> list[StoredRun]:
    """The runs of `experiment` in every store (narrowed by `narrow`), each run once however many hold it."""
    selection = Selection((("experiment", experiment), *(narrow.pairs if narrow else ())),
                          f"experiment={experiment}" + (f",{narrow.text}" if narrow and narrow.text else ""))
    seen: dict[str, StoredRun] = {}
    for store in stores:
        for run in select_runs(store, selection):
            seen.setdefault(run.run_key, run)
    return sorted(seen.values(), key=lambda r: (r.finished_at, r.site, r.point))


def newest_sweeps(runs: list[StoredRun]) -> dict[str, tuple[StoredSweep, int]]:
    """Each site's newest sweep (by its runs' end), with how many sweeps the site has."""
    by_site: dict[str, list[StoredRun]] = {}
    for run in runs:
        by_site.setdefault(run.site, []).append(run)
    out = {}
    for site, members in by_site.items():
        sweeps = stored_sweeps(members)
        out[site] = (sweeps[-1], len(sweeps))
    return out


def _speedup(row: Row, base: Baseline | None) -> Stat | None:
    return None if base is None else Stat.of([base.row.time_s.mean / m.time_s for m in row.runs])


def _verdict(row: Row, site: str, base: Baseline | None, tolerance: float) -> str:
    if base is None:
        return "cannot judge: no baseline"
    if row.baseline and site == base.site:
        return "baseline"
    return judge_parity([m.top1 for m in row.runs], [m.top1 for m in base.row.runs], tolerance).verdict


def _measured(sweep: StoredSweep, row: Row, base: Baseline | None) -> TableRow:
    first = sweep.first
    return TableRow(MEASURED, first.site, first.hardware, row.gpus, row.nodes, first.framework, first.precision,
                    row.net, batch_label(row.points[0], row.batch), row.lr, row.epochs, row.time_s,
                    _speedup(row, base), row.top1, row.top5, _verdict(row, first.site, base, sweep.summary.tolerance),
                    f"{base.site}'s baseline" if base else "", MEASURED, sweep.key, first.commit)


def _failed(sweep: StoredSweep, record: RunRecord) -> TableRow:
    first = sweep.first
    return TableRow(FAILED, first.site, first.hardware, record.gpus, record.nodes, first.framework,
                    first.precision, first.net, batch_label(record.point, record.batch), record.lr, None, None,
                    None, None, None, cells.failure_text(record), "", MEASURED, sweep.key, first.commit)


def published_row(ref: ReferenceRow) -> TableRow:
    """A reference file's row as the table shows it, its speedup as printed."""
    gpus = ref.gpus
    device = ref.hardware.split(maxsplit=1)[1] if gpus is not None and " " in ref.hardware.strip() else ref.hardware
    one = lambda v: None if v is None else Stat(float(v), None, 1)  # noqa: E731
    return TableRow(PUBLISHED, ref.site, device, gpus, None, ref.framework, "", ref.net,
                    "" if ref.batch is None else str(ref.batch), ref.initial_lr, one(ref.epochs),
                    one(ref.train_time_h * 3600.0), one(ref.speedup), one(ref.top1), one(ref.top5), "",
                    "as published", ref.source or "no source given")


def _own_baseline(sweep: StoredSweep) -> Baseline | None:
    row = sweep.summary.baseline
    return None if row is None else Baseline(sweep.first.site, row, sweep.first.hardware)


def _site_order(found: dict[str, tuple[StoredSweep, int]], sites: list[str] | None, explicit: bool,
                experiment: str, where: str) -> list[str]:
    if explicit and sites:
        for site in sites:
            if site not in found:
                raise FirescaleError(f"site {site!r} has no runs of experiment {experiment!r} in {where} "
                                     f"(sites with runs: {', '.join(sorted(found))})")
        return list(dict.fromkeys(sites))
    listed = [s for s in (sites or []) if s in found]
    return list(dict.fromkeys(listed + sorted(found)))


def _chosen_baseline(found: dict[str, tuple[StoredSweep, int]], baseline_site: str, experiment: str,
                     where: str) -> Baseline:
    if baseline_site not in found:
        raise FirescaleError(f"--baseline-site {baseline_site}: that site has no runs of experiment {experiment!r} "
                             f"in {where}, so no baseline to take speedups against")
    sweep = found[baseline_site][0]
    base = _own_baseline(sweep)
    if base is None:
        raise FirescaleError(f"--baseline-site {baseline_site}: its newest sweep of {experiment!r} "
                             f"({sweep.key[:12]}) has no succeeded baseline run to take speedups against")
    return base


def build_table(experiment: str, runs: list[StoredRun], *, where: str, sites: list[str] | None = None,
                explicit: bool = False, baseline_site: str | None = None,
                references: Iterable[ReferenceRow] = ()) -> CrossSiteTable:
    """The table of `experiment` from `runs` (read from `where`, the stores named in messages): the newest
    sweep of each site (`sites`: their order; with `explicit`, only they, each required), speedups and
    parity against each site's own baseline or `baseline_site`'s, then the published rows."""
    if not runs:
        raise FirescaleError(f"no runs of experiment {experiment!r} in {where}; `firescale results add` or "
                             f"`firescale report --store site` puts a sweep's runs there")
    found = newest_sweeps(runs)
    order = _site_order(found, sites, explicit, experiment, where)
    chosen = _chosen_baseline(found, baseline_site, experiment, where) if baseline_site else None
    rows: list[TableRow] = []
    for site in order:
        sweep = found[site][0]
        base = chosen or _own_baseline(sweep)
        rows += [_measured(sweep, row, base) for row in sweep.summary.rows]
        rows += [_failed(sweep, record) for record in sweep.summary.failures]
    published = [published_row(ref) for ref in references]
    return CrossSiteTable(experiment, tuple(order), rows + published,
                          caption(experiment, order, found, chosen, published),
                          notes(order, found, sweep_tolerance(found)))


def sweep_tolerance(found: dict[str, tuple[StoredSweep, int]]) -> float:
    return next(iter(found.values()))[0].summary.tolerance


def caption(experiment: str, order: list[str], found: dict[str, tuple[StoredSweep, int]],
            chosen: Baseline | None, published: list[TableRow]) -> str:
    """What the table shows and which baseline each speedup is against."""
    text = f"{experiment} across {', '.join(order)}: train time, speedup and accuracy of each site's newest sweep"
    if chosen is not None:
        text += (f"; every measured row's speedup and parity are against {chosen.site}'s baseline "
                 f"({chosen.describe()})")
    else:
        bases = []
        for site in order:
            base = _own_baseline(found[site][0])
            bases.append(f"{site}: {base.describe()}" if base else f"{site}: no baseline, so no speedup")
        text += f"; each site's speedup and parity are against its own baseline ({'; '.join(bases)})"
    sources = list(dict.fromkeys(r.source for r in published))
    if sources:
        text += (f". Published rows ({'; '.join(sources)}) give their speedups as printed there, "
                 f"against their own baseline")
    return text + "."


def notes(order: list[str], found: dict[str, tuple[StoredSweep, int]], tolerance: float) -> list[str]:
    """The sentences under the table: where each site's rows come from, and how they are computed."""
    out = []
    for site in order:
        sweep, count = found[site]
        first = sweep.first
        commit = first.commit[:12] + ("+" if first.dirty else "")
        newest = f"the newest of its {count} sweeps" if count > 1 else "its only sweep"
        out.append(f"{site}: sweep {sweep.key[:12]} (commit {commit}, {first.framework}, {first.precision}, "
                   f"finished {sweep.finished_at}), {newest} of the runs read.")
    out.append("Measured rows give mean ± sample standard deviation over a point's repeats; speedup = baseline "
               "train time / this train time, per repeat; train time is each run's whole fixed-epoch budget.")
    out.append(f"Parity: a point's final top-1 against the baseline's with a tolerance of {tolerance * 100:g} pts "
               f"(Welch's {cells.CI} with repeats on both sides, else the means), as the report judges it.")
    return out
