"""Bad input to the store is one sentence: not a store, a damaged file, a newer schema, a wrong URL or
password, a selection that matches nothing or does not parse, a run folder without its record."""
from __future__ import annotations

import json
import sqlite3

import pytest
from store_records import RUNS

from firescale.cli import main
from firescale.errors import FirescaleError
from firescale.store.add import run_files
from firescale.store.database import open_store, store_url
from firescale.store.select import Selection


def _error(capsys, argv):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("firescale: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_a_file_that_is_not_sqlite_is_named(tmp_path, capsys):
    (tmp_path / "notes.sqlite").write_text("these are my notes\n")
    err = _error(capsys, ["results", "list", "--store", str(tmp_path / "notes.sqlite")])
    assert "notes.sqlite is not a SQLite file" in err


def test_a_damaged_sqlite_file_is_named(tmp_path, capsys):
    good = tmp_path / "good.sqlite"
    assert main(["results", "add", str(RUNS), "--store", str(good)]) == 0
    capsys.readouterr()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(good.read_bytes()[:1000])
    err = _error(capsys, ["results", "list", "--store", str(cut)])
    assert "cut.sqlite is a damaged SQLite file" in err and "backup" in err


def test_another_programs_database_is_not_a_store(tmp_path, capsys):
    with sqlite3.connect(tmp_path / "other.sqlite") as conn:
        conn.execute("create table invoices (id integer)")
    err = _error(capsys, ["results", "add", str(RUNS), "--store", str(tmp_path / "other.sqlite")])
    assert "holds tables (invoices) but is not a firescale results store" in err
    with sqlite3.connect(tmp_path / "other.sqlite") as conn:
        assert conn.execute("select count(*) from sqlite_master where name = 'runs'").fetchone()[0] == 0


def test_a_store_of_a_newer_schema_is_refused(tmp_path, capsys):
    path = tmp_path / "new.sqlite"
    open_store(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute("update store_meta set value = '7' where key = 'schema_version'")
    err = _error(capsys, ["results", "list", "--store", str(path)])
    assert "schema version 7, written by a newer firescale" in err and "up to 2" in err


def test_a_store_that_does_not_exist_is_made_only_by_add(tmp_path, capsys):
    err = _error(capsys, ["results", "list", "--store", str(tmp_path / "none.sqlite")])
    assert "does not exist; `firescale results add` creates it" in err
    assert not (tmp_path / "none.sqlite").exists()


def test_no_store_named_says_how_to_name_one(monkeypatch):
    monkeypatch.delenv("FIRESCALE_RESULTS_URL", raising=False)
    with pytest.raises(FirescaleError, match="no results store named: give --store URL"):
        store_url(None, None)
    monkeypatch.setenv("FIRESCALE_RESULTS_URL", "postgresql://me@db.example/results")
    assert store_url(None, None) == "postgresql://me@db.example/results"


def test_a_password_in_a_postgres_url_is_refused_and_not_echoed(capsys):
    err = _error(capsys, ["results", "list", "--store", "postgresql://me:s3cret@127.0.0.1:1/results"])
    assert "holds a password" in err and "s3cret" not in err and "pgpass" in err


def test_a_postgres_server_that_does_not_answer(capsys):
    import socket

    with socket.socket() as s:          # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = _error(capsys, ["results", "list", "--store", f"postgresql://me@127.0.0.1:{port}/results"])
    assert f"127.0.0.1:{port}/results does not answer" in err


@pytest.mark.postgres
def test_a_postgres_server_that_refuses_the_credentials(postgres_url, capsys, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", "/dev/null")
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    err = _error(capsys, ["results", "list", "--store", postgres_url])
    assert "refused the credentials" in err and "not-the-password" not in err


def test_a_store_kind_firescale_does_not_speak(capsys):
    err = _error(capsys, ["results", "list", "--store", "mysql://me@host/db"])
    assert "'mysql' is not a store kind firescale speaks" in err


def test_a_selection_matching_no_runs(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    assert main(["results", "add", str(RUNS), "--store", str(store)]) == 0
    capsys.readouterr()
    err = _error(capsys, ["results", "list", "--store", str(store), "--site", "titan"])
    assert "no runs match site=titan" in err


@pytest.mark.parametrize("text, message", [
    ("sit=local", "unknown key 'sit'; did you mean 'site'?"),
    ("site", "'site' is not key=value"),
    ("since=yesterday", "since='yesterday' is not a date"),
])
def test_a_selection_that_does_not_parse(text, message):
    with pytest.raises(FirescaleError, match=message.replace("?", r"\?")):
        Selection.parse(text, "A")


def test_run_folders_without_a_finished_record(tmp_path, capsys):
    (tmp_path / "runs" / "g2-b64-r0").mkdir(parents=True)
    err = _error(capsys, ["results", "add", str(tmp_path / "runs"), "--store", str(tmp_path / "s.sqlite")])
    assert "g2-b64-r0: a point folder without its finished record (result.json)" in err
    assert not (tmp_path / "s.sqlite").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FirescaleError, match="holds no run record"):
        run_files(tmp_path / "empty")
    with pytest.raises(FirescaleError, match="no such run folder"):
        run_files(tmp_path / "nowhere")


def test_a_trainers_own_result_is_not_a_sweep_record(tmp_path, capsys):
    raw = json.loads((RUNS / "baseline" / "result.json").read_text())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "result.json").write_text(json.dumps(raw["train"]))
    err = _error(capsys, ["results", "add", str(tmp_path / "run"), "--store", str(tmp_path / "s.sqlite")])
    assert "a trainer's result (firescale.train.result/1), not a sweep's run record" in err


def test_a_half_written_record_is_named_and_nothing_is_added(tmp_path, capsys):
    import shutil

    runs = shutil.copytree(RUNS, tmp_path / "runs")
    text = (runs / "g2-b64-r1" / "result.json").read_text()
    (runs / "g2-b64-r1" / "result.json").write_text(text[: len(text) // 2])
    err = _error(capsys, ["results", "add", str(runs), "--store", str(tmp_path / "s.sqlite")])
    assert "g2-b64-r1/result.json" in err
    assert not (tmp_path / "s.sqlite").exists()


def _as_version_1(path):
    """A store as firescale wrote it at schema version 1: each run in the sweep it was first added with, and
    no sweep_runs table."""
    with sqlite3.connect(path) as conn:
        conn.execute("drop table sweep_runs")
        conn.execute("update store_meta set value = '1' where key = 'schema_version'")


def test_a_version_1_store_is_migrated_on_open_and_keeps_every_run_in_its_sweep(tmp_path, capsys):
    path = tmp_path / "old.sqlite"
    assert main(["results", "add", str(RUNS), "--store", str(path)]) == 0
    _as_version_1(path)
    store = open_store(f"sqlite:///{path}")
    assert store.migrated_from == 1
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("select value from store_meta where key = 'schema_version'").fetchone() == ("2",)
        assert conn.execute("select count(*) from sweep_runs").fetchone() == (5,)
    capsys.readouterr()
    assert main(["results", "list", "--store", str(path)]) == 0
    assert "1.46x (g2-b64)" in capsys.readouterr().out


def test_a_failed_migration_step_changes_nothing(tmp_path, monkeypatch):
    from firescale.store import database, schema

    path = tmp_path / "old.sqlite"
    assert main(["results", "add", str(RUNS), "--store", str(path)]) == 0
    _as_version_1(path)

    def broken(conn):
        schema.sweep_runs.create(conn)
        raise RuntimeError("step failed")

    monkeypatch.setitem(schema.MIGRATIONS, 1, broken)
    with pytest.raises(RuntimeError, match="step failed"):
        open_store(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        assert conn.execute("select value from store_meta where key = 'schema_version'").fetchone() == ("1",)
        assert conn.execute("select count(*) from sqlite_master where name = 'sweep_runs'").fetchone() == (0,)
    assert database.SCHEMA_VERSION == 2
