"""Adding runs to a store: found in a sweep's folders, grouped into sweeps, each run once.

A run's identity is its record (store/runs.py `run_key`): the same record added again, from the same
folder or a copy elsewhere, changes nothing but may attach a new tag.  A sweep is the runs measured
against one baseline: its identity is the site, the experiment and its baseline records, so a resumed
sweep adds its new points to the sweep it began.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.engine import Connection

from firescale.atomic import load_json
from firescale.errors import FirescaleError
from firescale.store.database import Store
from firescale.store.runs import RunContext, StoredRun, digest, stored_run, utc_now
from firescale.store.schema import run_tags, runs, sweep_runs, sweeps
from firescale.sweep.descriptions import EXPERIMENT_FILE
from firescale.sweep.records import POINT_NAME, RUN_FILE, RUN_FORMAT

_CHUNK = 500   # keys a statement names at once (SQLite's limit on bound parameters is 32,766)


@dataclass
class AddReport:
    """What an add did: runs new to the store, runs it already held, tags attached, sweeps touched."""

    added: int = 0
    already: int = 0
    tagged: int = 0
    sweeps: list[str] = field(default_factory=list)


def run_files(folder: Path) -> list[Path]:
    """The run records a folder names: itself a point (<point>/result.json), a sweep's runs/ folder, or an
    experiment's results folder holding runs/."""
    if not folder.exists():
        raise FirescaleError(f"{folder}: no such run folder")
    if not folder.is_dir():
        raise FirescaleError(f"{folder}: not a folder; name a point's run folder or a sweep's runs/ folder")
    if (folder / RUN_FILE).is_file():
        return [folder / RUN_FILE]
    base = folder / "runs" if (folder / "runs").is_dir() else folder
    points = sorted(p for p in base.iterdir() if p.is_dir() and POINT_NAME.fullmatch(p.name))
    if not points:
        raise FirescaleError(f"{folder}: holds no run record (<point>/{RUN_FILE}); name a point's run folder, a "
                             f"sweep's runs/ folder or results/<site>/<experiment>")
    missing = [p for p in points if not (p / RUN_FILE).is_file()]
    if missing:
        raise FirescaleError(f"{missing[0]}: a point folder without its finished record ({RUN_FILE}); "
                             f"let its `sweep run` finish, or leave the folder out")
    return [p / RUN_FILE for p in points]


def read_raw_record(path: Path) -> dict[str, Any]:
    """A run record as written, refusing the trainer's own result.json (it is not a sweep's record)."""
    data = load_json(path, "run record")
    if isinstance(data, dict) and data.get("format") != RUN_FORMAT and "net" in data and "evals" in data:
        raise FirescaleError(f"{path}: a trainer's result ({data.get('format')}), not a sweep's run record "
                             f"({RUN_FORMAT}); add the sweep's runs/<point> folder, which `sweep run` writes")
    if not isinstance(data, dict):
        raise FirescaleError(f"{path}: a run record must be a JSON object, found {type(data).__name__}")
    return data


def sweep_key(site: str, experiment: str, members: list[StoredRun]) -> str:
    """The identity of the sweep these runs belong to: its baselines' records, else the runs themselves."""
    keys = sorted(r.run_key for r in members if r.baseline) or sorted(r.run_key for r in members)
    return digest({"site": site, "experiment": experiment, "anchor": keys})


def group_sweeps(found: Iterable[StoredRun]) -> dict[str, list[StoredRun]]:
    """The runs by sweep (one per site and experiment among those added together)."""
    by_pair: dict[tuple[str, str], list[StoredRun]] = {}
    for run in found:
        by_pair.setdefault((run.site, run.experiment), []).append(run)
    out: dict[str, list[StoredRun]] = {}
    for (site, experiment), members in by_pair.items():
        key = sweep_key(site, experiment, members)
        out[key] = [replace(r, sweeps=(key,)) for r in members]
    return out


def _sweep_id(conn: Connection, store: Store, key: str, members: list[StoredRun], source: str) -> int:
    """The id of sweep `key`, made now if the store has no such sweep."""
    first = min(members, key=lambda r: (not r.baseline, r.gpus, r.batch, r.repeat))
    insert = store.insert(sweeps).values(
        sweep_key=key, site=first.site, experiment=first.experiment, net=first.net, commit=first.commit,
        dirty=first.dirty, framework=first.framework, precision=first.precision,
        versions_digest=first.versions_digest, hardware=first.hardware, tolerance=first.tolerance,
        added_at=utc_now(), source=source)
    conn.execute(insert.on_conflict_do_nothing(index_elements=["sweep_key"]))
    return int(conn.execute(select(sweeps.c.id).where(sweeps.c.sweep_key == key)).scalar_one())


def _new_runs(conn: Connection, store: Store, sweep_id: int, members: list[StoredRun]) -> int:
    rows = [{**r.row(), "sweep_id": sweep_id} for r in members]
    added = 0
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start:start + _CHUNK]
        have = set(conn.execute(select(runs.c.run_key).where(runs.c.run_key.in_([r["run_key"] for r in chunk])))
                   .scalars())
        fresh = [r for r in chunk if r["run_key"] not in have]
        if fresh:
            # RETURNING counts what this transaction inserted: another writer may have added the same run
            # between the look-up and the insert (PostgreSQL's concurrent adds).
            insert = store.insert(runs).on_conflict_do_nothing(index_elements=["run_key"]).returning(runs.c.run_key)
            added += len(conn.execute(insert, fresh).all())
    return added


def _link(conn: Connection, store: Store, table: Table, members: list[StoredRun], **fixed: Any) -> int:
    """Link every one of `members` (by its id) to `fixed` in `table` (run_tags, sweep_runs), each link once;
    the links made."""
    made = 0
    for start in range(0, len(members), _CHUNK):
        keys = [r.run_key for r in members[start:start + _CHUNK]]
        ids = conn.execute(select(runs.c.id).where(runs.c.run_key.in_(keys))).scalars().all()
        match = [table.c[name] == value for name, value in fixed.items()]
        have = set(conn.execute(select(table.c.run_id).where(table.c.run_id.in_(ids), *match)).scalars())
        fresh = [{"run_id": i, **fixed} for i in ids if i not in have]
        if fresh:
            conflict = ["run_id", *fixed]
            conn.execute(store.insert(table).on_conflict_do_nothing(index_elements=conflict), fresh)
            made += len(fresh)
    return made


def add_runs(store: Store, found: list[StoredRun], *, tag: str | None = None, source: str = "") -> AddReport:
    """Add `found` in one transaction: a run the store holds already is left as it is, but joins the sweep
    it was found in (and takes the tag)."""
    report = AddReport()
    with store.writing() as conn:
        for key, members in group_sweeps(found).items():
            sweep_id = _sweep_id(conn, store, key, members, source)
            added = _new_runs(conn, store, sweep_id, members)
            _link(conn, store, sweep_runs, members, sweep_id=sweep_id)
            report.added += added
            report.already += len(members) - added
            report.sweeps.append(key)
            if tag:
                report.tagged += _link(conn, store, run_tags, members, tag=tag)
    return report


def folder_context(folder: Path, base: RunContext) -> RunContext:
    """What the sweep's files beside a runs folder add to `base`: the experiment's settings (its own
    experiment.yaml, or results/<site>/experiments.yaml of a sweep written before there was one) and the
    calibrated predictions (predict-calibrated.json)."""
    from firescale.report.summary import load_predictions

    exp_dir = folder.parent if folder.name == "runs" else (folder.parent.parent if (folder / RUN_FILE).is_file()
                                                          else folder)
    context = base
    predictions = exp_dir / "predict-calibrated.json"
    if predictions.is_file() and not context.predictions:
        context = replace(context, predictions=load_predictions(predictions))
    own = exp_dir / EXPERIMENT_FILE
    settings = _experiment_settings(own if own.is_file() else exp_dir.parent / "experiments.yaml", exp_dir.name)
    if settings:
        context = replace(context, tolerance=context.tolerance if context.tolerance is not None
                          else settings.get("tolerance"),
                          framework=context.framework or settings.get("framework"),
                          precision=context.precision or settings.get("precision"))
    return context


def _experiment_settings(path: Path, experiment: str) -> dict[str, Any]:
    """The tolerance, framework and precision the workflow's copy of the experiments file gives."""
    if not path.is_file():
        return {}
    from firescale.yamlfile import load_yaml

    try:
        config = load_yaml(path)
    except FirescaleError:
        return {}
    exp = ((config or {}).get("experiments") or {}).get(experiment) if isinstance(config, dict) else None
    if not isinstance(exp, dict):
        return {}
    return {"tolerance": (exp.get("target") or {}).get("tolerance"), "framework": exp.get("framework"),
            "precision": exp.get("precision")}


def runs_in_folder(folder: Path, context: RunContext,
                   site_of: Callable[[str], Any | None] = lambda name: None) -> list[StoredRun]:
    """The stored form of every run record under `folder`; `site_of` gives a record's site profile (its
    hardware), or None where the site is not known here."""
    context = folder_context(folder, context)
    found = []
    for path in run_files(folder):
        raw = read_raw_record(path)
        site = site_of(str(raw.get("site") or "")) if not context.hardware else None
        here = replace(context, hardware=str(site.config["device"]["name"])) if site is not None else context
        found.append(stored_run(raw, here, where=str(path)))
    return found
