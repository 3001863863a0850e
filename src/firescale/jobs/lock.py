"""A lock on a point's run folder: created atomically, naming its holder, cleared when the holder is gone.

The lock file is written complete under a temporary name and then hard-linked to its place, which fails
if a lock is there (atomic on every POSIX filesystem, NFS included).  A lock is stale, and taken over,
when its holder is gone: on the same host, its process no longer exists (or the pid now belongs to
another process, or the host rebooted); on another host, it has not refreshed the lock for
`stale_after` seconds (the holder refreshes it every time it polls the scheduler).
"""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from firescale.atomic import shared_mode
from firescale.errors import FirescaleError

LOCK_FILE = "firescale.lock"
STALE_AFTER_S = 900.0


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, /proc), to tell a reused pid apart; "" if unknown."""
    stat = _read_text(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run folder: host, process, user, since when, doing what."""

    host: str
    pid: int
    process_start: str
    boot_id: str
    user: str
    since: str
    command: str

    @classmethod
    def this_process(cls, command: str) -> LockHolder:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
        return cls(host=socket.gethostname(), pid=os.getpid(), process_start=process_start(os.getpid()),
                   boot_id=_read_text("/proc/sys/kernel/random/boot_id"), user=user,
                   since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command=command)

    def words(self) -> str:
        return f"{self.user} on {self.host} (pid {self.pid}, since {self.since}: {self.command})"


def _holder_gone(holder: LockHolder, lock: Path, stale_after: float) -> bool:
    if holder.host != socket.gethostname():
        try:
            return time.time() - lock.stat().st_mtime > stale_after
        except FileNotFoundError:
            return True
    if holder.boot_id and holder.boot_id != _read_text("/proc/sys/kernel/random/boot_id"):
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by someone else
    return bool(holder.process_start) and process_start(holder.pid) not in ("", holder.process_start)


def _read_holder(lock: Path) -> LockHolder | None:
    """The lock's holder; None when there is no lock (or one still being written)."""
    try:
        text = lock.read_text()
        return LockHolder(**json.loads(text)) if text else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise FirescaleError(f"{lock}: not a firescale lock file ({exc}); "
                             f"if no sweep runs this point, delete it") from None


@dataclass
class RunLock:
    """A held lock on one run folder."""

    path: Path
    holder: LockHolder

    def refresh(self) -> None:
        """Tell other hosts the holder is alive (the lock's modification time)."""
        with contextlib.suppress(OSError):
            os.utime(self.path)

    def release(self) -> None:
        with contextlib.suppress(FirescaleError):
            if _read_holder(self.path) == self.holder:
                self.path.unlink(missing_ok=True)


def _try_create(lock: Path, holder: LockHolder) -> bool:
    text = json.dumps(asdict(holder), indent=2, sort_keys=True) + "\n"
    tmp = lock.with_name(f".{lock.name}.{holder.host}.{holder.pid}")
    tmp.write_text(text)
    os.chmod(tmp, shared_mode())
    try:
        os.link(tmp, lock)
        return True
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: an exclusive create, then the holder's name
        return _create_exclusively(lock, text)
    finally:
        tmp.unlink(missing_ok=True)


def _create_exclusively(lock: Path, text: str) -> bool:
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return True


def _clear_stale(lock: Path, stale: LockHolder) -> None:
    """Move a stale lock aside; put it back if, in the meantime, it was another's fresh lock."""
    aside = lock.with_name(f".{lock.name}.stale-{os.getpid()}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return
    if _read_holder(aside) != stale:
        with contextlib.suppress(FileExistsError):
            os.link(aside, lock)
        aside.unlink(missing_ok=True)
        raise FirescaleError(f"{lock}: another sweep took this point at the same moment; run again to see which")
    aside.unlink(missing_ok=True)


def _attempt(lock: Path, me: LockHolder, stale_after: float) -> RunLock | LockHolder:
    """Take `lock` for `me`, clearing a lock whose holder is gone; else the live holder."""
    for _ in range(3):
        if _try_create(lock, me):
            return RunLock(lock, me)
        holder = _read_holder(lock)
        if holder is None:
            continue
        if not _holder_gone(holder, lock, stale_after):
            return holder
        print(f"firescale: clearing the lock of {holder.words()}, which is gone", file=sys.stderr)
        _clear_stale(lock, holder)
    raise FirescaleError(f"{lock}: could not take the lock (it keeps changing hands); try again")


def take_lock(run_dir: Path, command: str, stale_after: float = STALE_AFTER_S) -> RunLock:
    """Lock `run_dir` for this process, clearing a lock whose holder is gone; a live holder is named."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / LOCK_FILE
    got = _attempt(lock, LockHolder.this_process(command), stale_after)
    if isinstance(got, LockHolder):
        raise FirescaleError(
            f"{lock}: this point is being run by {got.words()}; two sweeps must not run one point. "
            f"If that process is gone, delete {lock}")
    return got


def take_lock_waiting(folder: Path, command: str, *, name: str, timeout: float,
                      stale_after: float = STALE_AFTER_S, poll: float = 0.02) -> RunLock:
    """Lock `folder/name`, waiting up to `timeout` seconds while a live holder has it (one writer at a time
    into a shared file: the results store); the holder is named when the wait runs out."""
    folder.mkdir(parents=True, exist_ok=True)
    lock, me = folder / name, LockHolder.this_process(command)
    deadline = time.monotonic() + timeout
    while True:
        got = _attempt(lock, me, stale_after)
        if isinstance(got, RunLock):
            return got
        if time.monotonic() > deadline:
            raise FirescaleError(f"{lock}: held by {got.words()} for over {timeout:.0f} s; if that process is "
                                 f"gone, delete {lock}")
        time.sleep(poll)
        poll = min(poll * 1.5, 0.5)


@contextlib.contextmanager
def run_lock(run_dir: Path, command: str, stale_after: float = STALE_AFTER_S) -> Iterator[RunLock]:
    """Hold the lock on `run_dir` for the block; released however the block ends."""
    held = take_lock(run_dir, command, stale_after)
    try:
        yield held
    finally:
        held.release()
