"""Opening a results store: which one (option, environment, site), SQLite or PostgreSQL, its version, its lock.

SQLite is the embedded default, one file in the site's results path.  Writers take the store's lock file
(firescale.jobs.lock, atomic on NFS) one at a time, on every filesystem, and the journal stays a rollback
journal: WAL needs shared memory that NFS, Lustre and GPFS do not give.  On a network filesystem readers
take the lock too, since SQLite's own byte-range locks are not to be trusted there.  PostgreSQL does its
own locking; credentials come from libpq's environment (PGPASSWORD, PGPASSFILE, ~/.pgpass), never from a
profile or a record.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Table, create_engine, event, inspect, select, text
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError, SQLAlchemyError

from firescale.errors import FirescaleError
from firescale.jobs.lock import take_lock_waiting
from firescale.store.schema import MIGRATIONS, SCHEMA_VERSION, STORE_FORMAT, metadata, store_meta

URL_VARIABLE = "FIRESCALE_RESULTS_URL"
STORE_FILE = "firescale-results.sqlite"
LOCK_WAIT_S = 600.0
# Filesystem types (/proc/mounts) on which SQLite's own locks and WAL cannot be relied on.
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "9p",
                       "panfs", "glusterfs", "fuse.glusterfs", "fuse.sshfs", "fuse.ceph", "afs", "orangefs")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_SCHEMA_LOCK_KEY = 0x66697265   # PostgreSQL advisory lock taken while a store's tables are made or migrated


def site_store_url(site: object) -> str:
    """The store a site names (`results_store` in its profile), else its results path's SQLite file."""
    config = getattr(site, "config", {}) or {}
    named = config.get("results_store")
    if named:
        return os.path.expandvars(str(named))
    return f"sqlite:///{Path(site.paths.results).resolve() / STORE_FILE}"  # type: ignore[attr-defined]


def store_url(given: str | None, site: object | None = None) -> str:
    """The store to use: `--store` (a URL or a path to a SQLite file), else $FIRESCALE_RESULTS_URL, else
    the site's; with none of the three, one sentence saying how to name one."""
    for value in (given, os.environ.get(URL_VARIABLE)):
        if value:
            return value if "://" in value else f"sqlite:///{Path(value).expanduser().resolve()}"
    if site is not None:
        return site_store_url(site)
    raise FirescaleError(f"no results store named: give --store URL (or a SQLite file's path), set "
                         f"{URL_VARIABLE}, or name a site (--site) to use its store")


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path` (the longest mount point of /proc/mounts above it)."""
    best, kind = "", ""
    target = str(path.resolve())
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, parts[2]
    except OSError:
        return ""
    return kind


def on_network_filesystem(path: Path) -> bool:
    forced = os.environ.get("FIRESCALE_STORE_NETWORK_FS")
    if forced in ("0", "1"):
        return forced == "1"
    return filesystem_type(path) in NETWORK_FILESYSTEMS


def _display(url: str) -> str:
    """The URL as messages show it: any password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


@dataclass
class Store:
    """An open results store: its engine, and for SQLite the file and its lock."""

    url: str
    engine: Engine
    sqlite_file: Path | None = None
    network_fs: bool = False
    version: int = SCHEMA_VERSION
    migrated_from: int | None = None
    _closed: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        return str(self.sqlite_file) if self.sqlite_file is not None else _display(self.url)

    @contextlib.contextmanager
    def writing(self, command: str = "firescale results add") -> Iterator[Connection]:
        """A transaction that writes: under the store's lock for SQLite, committed when the block ends."""
        with self._locked(command, always=True), self.engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def reading(self) -> Iterator[Connection]:
        with self._locked("firescale results (reading)", always=False), self.engine.connect() as conn:
            yield conn

    @contextlib.contextmanager
    def _locked(self, command: str, *, always: bool) -> Iterator[None]:
        if self.sqlite_file is None or not (always or self.network_fs):
            yield
            return
        folder = self.sqlite_file.parent
        held = take_lock_waiting(folder, command, name=f"{self.sqlite_file.name}.lock", timeout=LOCK_WAIT_S)
        try:
            yield
        finally:
            held.release()

    def insert(self, table: Table) -> Any:
        """An INSERT in this store's dialect, which has `on_conflict_do_nothing`."""
        if self.sqlite_file is not None:
            return sqlite_insert(table)
        return postgresql_insert(table)

    def close(self) -> None:
        if not self._closed:
            self.engine.dispose()
            self._closed = True


def _sqlite_engine(url: str, create: bool) -> tuple[Engine, Path, bool]:
    database = make_url(url).database
    if not database or database == ":memory:":
        raise FirescaleError(f"results store {url}: name a SQLite file (sqlite:////path/to/store.sqlite)")
    path = Path(database).expanduser().resolve()
    if path.is_dir():
        raise FirescaleError(f"results store {path} is a folder; name the store's file inside it ({STORE_FILE})")
    if path.exists():
        with open(path, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
        if head and head != _SQLITE_MAGIC:
            raise FirescaleError(f"results store {path} is not a SQLite file (it does not start with SQLite's "
                                 f"header); name a firescale store or a new file")
    elif not create:
        raise FirescaleError(f"results store {path} does not exist; `firescale results add` creates it")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    network = on_network_filesystem(path.parent)
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": LOCK_WAIT_S})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: object) -> None:
        # sqlite3 would commit before DDL on its own; firescale begins every transaction itself, so that a
        # migration's CREATE TABLE rolls back with the rest of its step.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=DELETE")   # never WAL: see the module's docstring
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine, path, network


def _postgres_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.password:
        raise FirescaleError(f"results store {_display(url)}: the URL holds a password; keep it out of profiles "
                             f"and command lines, in PGPASSWORD or a pgpass file (~/.pgpass, PGPASSFILE)")
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": 15})


def _check_version(conn: Connection, name: str) -> int | None:
    """The store's schema version, None for an empty database; refuses what is not a firescale store."""
    tables = set(inspect(conn).get_table_names())
    if not tables:
        return None
    if "store_meta" not in tables:
        raise FirescaleError(f"{name} holds tables ({', '.join(sorted(tables)[:4])}) but is not a firescale "
                             f"results store; name another database or a new file")
    meta: dict[str, str] = {str(k): str(v) for k, v in conn.execute(select(store_meta.c.key, store_meta.c.value))}
    if meta.get("format") != STORE_FORMAT or not str(meta.get("schema_version", "")).isdigit():
        raise FirescaleError(f"{name} has a store_meta table but is not a firescale results store "
                             f"(format {meta.get('format')!r})")
    version = int(meta["schema_version"])
    if version > SCHEMA_VERSION:
        raise FirescaleError(f"{name} is a results store of schema version {version}, written by a newer "
                             f"firescale; this one reads versions up to {SCHEMA_VERSION}: upgrade firescale")
    return version


def _prepare(store: Store, create: bool) -> None:
    """Create an empty store's tables, or migrate an older one, under the write lock."""
    with store.writing("firescale results (opening the store)") as conn:
        if store.sqlite_file is None:
            # Two first adds at once would both create the tables: PostgreSQL takes them one at a time.
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
        version = _check_version(conn, store.name)
        if version is None:
            if not create:
                raise FirescaleError(f"results store {store.name} is empty; `firescale results add` fills it")
            metadata.create_all(conn)
            conn.execute(store_meta.insert(), [{"key": "format", "value": STORE_FORMAT},
                                               {"key": "schema_version", "value": str(SCHEMA_VERSION)}])
            return
        if version < SCHEMA_VERSION:
            store.migrated_from = version
            for step in range(version, SCHEMA_VERSION):
                MIGRATIONS[step](conn)
            conn.execute(store_meta.update().where(store_meta.c.key == "schema_version")
                         .values(value=str(SCHEMA_VERSION)))


def open_store(url: str, *, create: bool = True) -> Store:
    """Open (and, with `create`, make) the store at `url`; every failure is one sentence naming it."""
    try:
        kind = make_url(url).get_backend_name()
    except ArgumentError:
        raise FirescaleError(f"results store {url!r} is not a URL (sqlite:////path/store.sqlite or "
                             f"postgresql://user@host/db) nor a file path") from None
    if kind == "sqlite":
        engine, path, network = _sqlite_engine(url, create)
        store = Store(url, engine, sqlite_file=path, network_fs=network)
    elif kind in ("postgresql", "postgres"):
        store = Store(url, _postgres_engine(url))
    else:
        raise FirescaleError(f"results store {_display(url)}: {kind!r} is not a store kind firescale speaks; "
                             f"use sqlite:/// (a file) or postgresql://")
    started = time.monotonic()
    try:
        _prepare(store, create)
    except FirescaleError:
        store.close()
        raise
    except SQLAlchemyError as exc:
        store.close()
        raise store_error(store.name, exc, time.monotonic() - started) from None
    return store


def store_error(name: str, exc: SQLAlchemyError, waited: float = 0.0) -> FirescaleError:
    """A database error as one sentence: what the store is and what went wrong."""
    text = str(getattr(exc, "orig", exc) or exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    lowered = first.lower()
    if isinstance(exc, DatabaseError) and ("file is not a database" in lowered or "malformed" in lowered):
        return FirescaleError(f"results store {name} is a damaged SQLite file ({first}); restore it from a "
                              f"backup (docs/store.md)")
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return FirescaleError(f"results store {name} refused the credentials ({first}); set PGPASSWORD or a "
                              f"pgpass file (~/.pgpass or PGPASSFILE) for that user")
    if "does not exist" in lowered and "database" in lowered:
        return FirescaleError(f"results store {name}: {first}; create the database first (createdb)")
    if isinstance(exc, OperationalError) and ("connection" in lowered or "timeout" in lowered):
        return FirescaleError(f"results store {name} does not answer ({first}); is the server running "
                              f"and reachable from here?")
    return FirescaleError(f"results store {name}: {first}")
