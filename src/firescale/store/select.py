"""Choosing runs from a store: `key=value` pairs joined by commas, and the query they make."""
from __future__ import annotations

import difflib
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, select

from firescale.errors import FirescaleError
from firescale.store.database import Store
from firescale.store.runs import StoredRun, from_row
from firescale.store.schema import run_tags, runs, sweep_runs, sweeps

KEYS = ("site", "experiment", "commit", "tag", "framework", "precision", "since", "until", "sweep")


def _day(text: str, key: str, where: str) -> str:
    """An ISO date or date-time as the ISO 8601 UTC text that `finished_at` holds; `until` a date means its end."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return (day + timedelta(days=1) if key == "until" else day).isoformat() + "T00:00:00Z"
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise FirescaleError(f"{where}: {key}={text!r} is not a date; write 2026-12-01 or "
                             f"2026-12-01T09:30:00Z") from None
    if when.tzinfo is not None:

        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Selection:
    """Which runs: each key given must match; `commit` matches a prefix, `since`/`until` bound finished_at."""

    pairs: tuple[tuple[str, str], ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, text: str, where: str = "selection") -> Selection:
        pairs = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, eq, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not value:
                raise FirescaleError(f"{where}: {part!r} is not key=value (keys: {', '.join(KEYS)})")
            if key not in KEYS:
                near = difflib.get_close_matches(key, KEYS, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise FirescaleError(f"{where}: unknown key {key!r}{hint} (keys: {', '.join(KEYS)})")
            if key in ("since", "until"):
                value = _day(value, key, where)
            pairs.append((key, value))
        return cls(tuple(pairs), text)

    def value(self, key: str) -> str | None:
        return next((v for k, v in self.pairs if k == key), None)

    def where(self) -> list[Any]:
        clauses: list[Any] = []
        for key, value in self.pairs:
            if key == "commit":
                clauses.append(runs.c.commit.startswith(value, autoescape=True))
            elif key == "since":
                clauses.append(runs.c.finished_at >= value)
            elif key == "until":
                clauses.append(runs.c.finished_at < value)
            elif key == "tag":
                clauses.append(runs.c.id.in_(select(run_tags.c.run_id).where(run_tags.c.tag == value)))
            elif key == "sweep":
                clauses.append(sweeps.c.sweep_key.startswith(value, autoescape=True))
            else:
                clauses.append(runs.c[key] == value)
        return clauses


def _memberships(selection: Selection) -> Select[Any]:
    """One row per run and sweep holding it, of the runs (and sweeps) `selection` names."""
    query = (select(runs, sweeps.c.sweep_key, sweeps.c.tolerance.label("sweep_tolerance"))
             .join(sweep_runs, sweep_runs.c.run_id == runs.c.id).join(sweeps, sweep_runs.c.sweep_id == sweeps.c.id))
    clauses = selection.where()
    return query.where(and_(*clauses)) if clauses else query


def _tags(conn: Any, ids: list[int]) -> dict[int, list[str]]:
    tags: dict[int, list[str]] = defaultdict(list)
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        for run_id, tag in conn.execute(select(run_tags.c.run_id, run_tags.c.tag).where(run_tags.c.run_id.in_(chunk))):
            tags[run_id].append(tag)
    return tags


def select_runs(store: Store, selection: Selection) -> list[StoredRun]:
    """The stored runs `selection` names, each once, oldest first, with its tags and the sweeps holding it
    (those `selection` names)."""
    with store.reading() as conn:
        rows = conn.execute(_memberships(selection).order_by(runs.c.finished_at, runs.c.id, sweeps.c.id)).all()
        first: dict[int, Any] = {}
        held: dict[int, list[str]] = defaultdict(list)
        tolerance: dict[int, float | None] = {}
        for row in rows:
            m = row._mapping
            first.setdefault(m["id"], row)
            held[m["id"]].append(m["sweep_key"])
            tolerance.setdefault(m["id"], m["sweep_tolerance"])
        tags = _tags(conn, list(first))
    return [from_row(row, tuple(sorted(tags[i])), tuple(held[i]), tolerance[i]) for i, row in first.items()]


def sweep_rows(store: Store, selection: Selection) -> list[dict[str, Any]]:
    """The store's sweeps that hold runs `selection` names, oldest first, as dicts of the `sweeps` table."""
    with store.reading() as conn:
        ids = _memberships(selection).with_only_columns(sweeps.c.id)
        rows = conn.execute(select(sweeps).where(sweeps.c.id.in_(ids)).order_by(sweeps.c.added_at, sweeps.c.id))
        return [dict(row._mapping) for row in rows]
