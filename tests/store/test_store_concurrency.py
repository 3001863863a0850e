"""Two sweeps adding at once into one store lose nothing and store nothing twice (SQLite and PostgreSQL)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from firescale.store.database import open_store
from firescale.store.schema import runs

HERE = Path(__file__).resolve().parent


def _writers(url: str, tmp_path: Path, count: int, env: dict[str, str], seeds: tuple[int, int] = (1, 2)) -> list[str]:
    start = tmp_path / "go"
    start.unlink(missing_ok=True)
    procs = [subprocess.Popen([sys.executable, str(HERE / "add_many.py"), url, str(seed), str(count), "10", str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for seed in seeds]
    start.touch()
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs.append(out.strip())
    return outs


def _count(url: str) -> tuple[int, int]:
    store = open_store(url, create=False)
    with store.reading() as conn:
        total = conn.execute(select(func.count()).select_from(runs)).scalar_one()
        distinct = conn.execute(select(func.count(runs.c.run_key.distinct()))).scalar_one()
    store.close()
    return total, distinct


@pytest.mark.parametrize("network_fs", ["0", "1"], ids=["local-disk", "as-on-nfs"])
def test_two_writers_into_one_sqlite_file(tmp_path, network_fs):
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "FIRESCALE_STORE_NETWORK_FS": network_fs}
    assert _writers(url, tmp_path, 200, env) == ["200", "200"]
    assert _count(url) == (400, 400)
    # Both again: every run is there already.
    assert _writers(url, tmp_path, 200, env) == ["0", "0"]
    assert _count(url) == (400, 400)
    added = _writers(url, tmp_path, 200, env, seeds=(3, 3))
    assert sum(map(int, added)) == 200
    assert _count(url) == (600, 600)
    assert not (tmp_path / "shared.sqlite.lock").exists()


@pytest.mark.postgres
def test_two_writers_into_one_postgres_database(tmp_path, postgres_url):
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    assert _writers(postgres_url, tmp_path, 200, env) == ["200", "200"]
    assert _count(postgres_url) == (400, 400)
    assert _writers(postgres_url, tmp_path, 200, env) == ["0", "0"]
    assert _count(postgres_url) == (400, 400)
    # Two writers adding the same 200 new runs at once: each run is stored by one of them.
    added = _writers(postgres_url, tmp_path, 200, env, seeds=(3, 3))
    assert sum(map(int, added)) == 200
    assert _count(postgres_url) == (600, 600)
