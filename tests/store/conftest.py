"""A real PostgreSQL server for the store's PostgreSQL tier: one per test worker, a fresh database per test."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from postgres import PostgresServer, PostgresUnavailable

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """Start a throwaway server for the session (each xdist worker starts its own, on its own port and folder);
    skip the test, naming why, where it cannot start; stop it at the end."""
    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(f"no PostgreSQL server for the PostgreSQL tier: {e}")
    with server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The URL (no password) of a fresh empty database owned by `firescale`; PGPASSFILE set to log in with it."""
    for key, value in postgres.env().items():
        monkeypatch.setenv(key, value)
    return postgres.make_database(f"test_{next(_databases)}")
