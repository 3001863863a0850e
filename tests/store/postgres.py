"""A real, throwaway PostgreSQL server from Debian's packages, for the store's PostgreSQL tier."""
from __future__ import annotations

import atexit
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

ROLE = "firescale"
DATABASE = "firescale_test"
SUPERUSER = "postgres"
# Quick rather than safe: the data die with the test run.
SETTINGS = {"listen_addresses": "127.0.0.1", "fsync": "off", "synchronous_commit": "off",
            "full_page_writes": "off", "max_connections": "50", "shared_buffers": "16MB",
            "log_min_messages": "warning"}


class PostgresUnavailable(RuntimeError):
    """Why a PostgreSQL server could not start here (the fixture skips the test with it)."""


def server_bin() -> Path:
    """The newest /usr/lib/postgresql/VERSION/bin that holds a server, else the folder of `initdb` on PATH."""
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").is_file()]
    if found:
        return max(found, key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)] or [0])
    initdb = shutil.which("initdb")
    if initdb is None:
        raise PostgresUnavailable("no PostgreSQL server: neither /usr/lib/postgresql/*/bin/initdb nor initdb on PATH "
                                  "(install Debian's postgresql, as `make setup` does as root)")
    return Path(initdb).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class PostgresServer:
    """A PostgreSQL server on 127.0.0.1 in a fresh temporary folder, started on construction; role `firescale`
    (its password in a pgpass file) owns the database `firescale_test`. Use it as a context manager or stop()."""

    def __init__(self, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.bin = server_bin()
        self.prefix = self._as_server_user()
        self.root = Path(tempfile.mkdtemp(prefix="firescale-pg-"))
        self.data, self.sockets, self.log = self.root / "data", self.root / "sockets", self.root / "server.log"
        self.pgpass = self.root / "pgpass"
        self.port = 0
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)

    @staticmethod
    def _as_server_user() -> list[str]:
        """PostgreSQL refuses to run as root: root runs it as the `postgres` user, anyone else as themselves."""
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            raise PostgresUnavailable("running as root, and there is no `postgres` user to run the server as "
                                      "(Debian's postgresql package creates it)") from None
        if shutil.which("runuser") is None:
            raise PostgresUnavailable("running as root, and there is no `runuser` to run the server as `postgres`")
        return ["runuser", "-u", SUPERUSER, "--"]

    def _run(self, what: str, *argv: str, log: Path | None = None) -> None:
        try:
            proc = subprocess.run([*self.prefix, str(self.bin / argv[0]), *argv[1:]], cwd=self.root, text=True,
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=self.timeout + 5)
        except subprocess.TimeoutExpired:
            raise PostgresUnavailable(f"{what} took more than {self.timeout + 5:.0f} s") from None
        if proc.returncode != 0:
            server_log = log.read_text(errors="replace") if log is not None and log.exists() else ""
            raise PostgresUnavailable(f"{what} failed (exit {proc.returncode}):\n"
                                      f"{_tail(proc.stdout + proc.stderr + server_log)}")

    def _start(self) -> None:
        self.sockets.mkdir()
        if self.prefix:
            for path in (self.root, self.sockets):
                shutil.chown(path, SUPERUSER, SUPERUSER)
        self._run("initdb", "initdb", "-D", str(self.data), "-U", SUPERUSER, "--encoding=UTF8", "--no-locale",
                  "--no-sync", "--auth-local=trust", "--auth-host=scram-sha-256")
        with (self.data / "postgresql.conf").open("a") as conf:   # appended: keeps the server user's ownership
            conf.writelines(f"{key} = '{value}'\n" for key, value in
                            {**SETTINGS, "unix_socket_directories": str(self.sockets)}.items())
        for attempt in range(3):   # another process may take the free port before the server binds it
            self.port = free_port()
            try:
                self._run("pg_ctl start", "pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                          "-t", str(int(self.timeout)), "-o", f"-p {self.port}", log=self.log)
                break
            except PostgresUnavailable as e:
                if attempt == 2 or "Address already in use" not in str(e):
                    raise
        password = secrets.token_hex(16)
        self._admin(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{password}'", f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        fd = os.open(self.pgpass, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"127.0.0.1:{self.port}:*:{ROLE}:{password}\nlocalhost:{self.port}:*:{ROLE}:{password}\n")

    def _admin(self, *statements: str) -> None:
        """Run statements as the superuser over the server's unix socket (trusted)."""
        import psycopg

        with psycopg.connect(host=str(self.sockets), port=self.port, user=SUPERUSER, dbname="postgres",
                             autocommit=True, connect_timeout=int(self.timeout)) as conn:
            for statement in statements:
                conn.execute(statement.encode())

    def url_of(self, database: str) -> str:
        """The SQLAlchemy URL of a database of this server, without the password (libpq reads PGPASSFILE)."""
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_of(DATABASE)

    def env(self) -> dict[str, str]:
        """What a client's environment needs to log in with url: the pgpass file."""
        return {"PGPASSFILE": str(self.pgpass)}

    def make_database(self, name: str) -> str:
        """Create a further empty database owned by `firescale`; return its URL."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"not a plain lower-case PostgreSQL name: {name!r}")
        self._admin(f"CREATE DATABASE {name} OWNER {ROLE}")
        return self.url_of(name)

    def stop(self) -> None:
        """Stop the server (fast shutdown, then immediate) and remove its folder; again is a no-op."""
        if (self.data / "postmaster.pid").exists():   # started, or half-started and timed out
            for mode in ("fast", "immediate"):
                try:
                    self._run("pg_ctl stop", "pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w",
                              "-t", str(int(self.timeout)))
                    break
                except PostgresUnavailable:
                    pass
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.stop)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
