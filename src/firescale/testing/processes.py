"""Processes by pid: read from a pid file, alive or not (a zombie has exited), signalled without complaint."""
from __future__ import annotations

import os
from pathlib import Path


def read_pid(path: Path) -> int | None:
    """The pid in `path` when that process is alive, else None."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def send_signal(pid: int, sig: int) -> None:
    """Signal `pid`; one that is gone, or not ours, is left alone."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
