"""The PostgreSQL tier's own server: logging in with the pgpass file, and the errors psycopg raises otherwise."""
from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from postgres import PostgresServer, free_port

pytestmark = pytest.mark.postgres


def _connect_error(url: str | sa.URL) -> psycopg.OperationalError:
    """The psycopg error under SQLAlchemy's when connecting to url fails."""
    engine = sa.create_engine(url, connect_args={"connect_timeout": 10})
    try:
        with pytest.raises(sa.exc.OperationalError) as caught:
            engine.connect()
    finally:
        engine.dispose()
    assert isinstance(caught.value.orig, psycopg.OperationalError)
    return caught.value.orig


def test_logs_in_with_the_pgpass_file(postgres_url: str) -> None:
    assert sa.make_url(postgres_url).password is None
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("select 1")).scalar_one() == 1
            user, database = conn.execute(sa.text("select current_user, current_database()")).one()
            conn.execute(sa.text("create table t (x int)"))   # the test's own database, owned by its role
            conn.commit()
    finally:
        engine.dispose()
    assert user == "firescale"
    assert database == sa.make_url(postgres_url).database != "firescale_test"


def test_a_wrong_password_is_refused(postgres: PostgresServer, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    error = _connect_error(sa.make_url(postgres.url).set(password="wrong"))
    assert 'password authentication failed for user "firescale"' in str(error)
    assert error.sqlstate is None
    assert "fe_sendauth: no password supplied" in str(_connect_error(postgres.url))


def test_a_missing_database_is_named(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSFILE", postgres.env()["PGPASSFILE"])
    assert 'database "no_such_db" does not exist' in str(_connect_error(postgres.url_of("no_such_db")))


def test_nothing_listening_is_refused() -> None:
    error = _connect_error(f"postgresql+psycopg://firescale@127.0.0.1:{free_port()}/firescale_test")
    assert "Connection refused" in str(error)
    assert "Is the server running on that host and accepting TCP/IP connections?" in str(error)
