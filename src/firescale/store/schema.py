"""The results store's tables, its schema version, and the migrations that bring an older store up to date.

One schema serves SQLite and PostgreSQL (SQLAlchemy Core emits each dialect's DDL).  A run's identity is
`runs.run_key`, the digest of its record; a sweep's is `sweeps.sweep_key`.  Numbers a comparison or a
table selects on have columns of their own; the whole run record is kept beside them as JSON text, so
nothing a run said is lost and a later firescale can read again what an earlier one stored.
"""
from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy.engine import Connection

STORE_FORMAT = "firescale.store"
# 1: sweeps, runs (each in the sweep it was first added with), run_tags.
# 2: sweep_runs: a run belongs to every sweep that holds it (a resumed sweep whose baseline was trained
#    again shares the runs it kept with the sweep it began).
# Raise it with a migration below whenever a table changes.
SCHEMA_VERSION = 2

metadata = MetaData()

store_meta = Table(
    "store_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

sweeps = Table(
    "sweeps", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("sweep_key", String(64), nullable=False, unique=True),
    Column("site", String(200), nullable=False),
    Column("experiment", String(200), nullable=False),
    Column("net", String(200), nullable=False),
    Column("commit", String(80), nullable=False),
    Column("dirty", Boolean, nullable=True),
    Column("framework", String(40), nullable=False),
    Column("precision", String(16), nullable=False),
    Column("versions_digest", String(64), nullable=False),
    Column("hardware", String(200), nullable=False),
    Column("tolerance", Float, nullable=True),
    Column("added_at", String(32), nullable=False),
    Column("source", Text, nullable=False),        # where it was first added from; informative, not identity
)

runs = Table(
    "runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_key", String(64), nullable=False, unique=True),
    Column("sweep_id", Integer, ForeignKey("sweeps.id"), nullable=False),   # the sweep it was first added with
    Column("site", String(200), nullable=False),
    Column("experiment", String(200), nullable=False),
    Column("point", String(120), nullable=False),
    Column("grp", String(120), nullable=False),
    Column("baseline", Boolean, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("nodes", Integer, nullable=False),
    Column("batch", Integer, nullable=False),
    Column("lr", Float, nullable=False),
    Column("repeat", Integer, nullable=False),
    Column("net", String(200), nullable=False),
    Column("dataset_sha256", String(64), nullable=False),
    Column("framework", String(40), nullable=False),
    Column("precision", String(16), nullable=False),
    Column("hardware", String(200), nullable=False),
    Column("commit", String(80), nullable=False),
    Column("dirty", Boolean, nullable=True),
    Column("versions", Text, nullable=False),          # JSON object, hostname left out
    Column("versions_digest", String(64), nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("finished_at", String(32), nullable=False),  # ISO 8601, UTC
    Column("added_at", String(32), nullable=False),
    Column("train_time_s", Float), Column("tta_s", Float), Column("iteration_s", Float),
    Column("data_wait_s", Float), Column("compute_s", Float), Column("allreduce_s", Float),
    Column("top1", Float), Column("top5", Float), Column("epochs", Float),
    Column("predicted_iteration_s", Float), Column("predicted_tta_s", Float),
    Column("record", Text, nullable=False),            # the run record (firescale.sweep.run/1) as JSON
    Index("runs_by_experiment", "experiment", "site", "finished_at"),
)

sweep_runs = Table(
    "sweep_runs", metadata,
    Column("sweep_id", Integer, ForeignKey("sweeps.id"), nullable=False),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
    UniqueConstraint("sweep_id", "run_id", name="sweep_runs_once"),
)

run_tags = Table(
    "run_tags", metadata,
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
    Column("tag", String(200), nullable=False),
    UniqueConstraint("run_id", "tag", name="run_tags_once"),
)



def _sweep_runs(conn: Connection) -> None:
    """1 -> 2: every run a member of the sweep it was added with."""
    sweep_runs.create(conn)
    conn.execute(sweep_runs.insert().from_select(["sweep_id", "run_id"], select(runs.c.sweep_id, runs.c.id)))


# from-version -> the step that brings a store of that version to the next one, inside the open
# transaction; each step must leave what older firescales wrote readable.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _sweep_runs}
