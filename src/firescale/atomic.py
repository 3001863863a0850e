"""Atomic writing (a file is absent, the old version, or complete; never half-written), and careful JSON reading.

Files and folders land with the mode the umask allows (0666 or 0777 minus the umask), as `open` would
give them, so results on a shared filesystem are group-readable wherever the umask says so, and a
report's files readable by a web server or a colleague; the temporary names from `mkstemp`/`mkdtemp`
would otherwise keep them private (0600/0700).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from firescale.errors import FirescaleError
from firescale.userfile import read_user_text


def current_umask() -> int:
    """This process's umask, read without changing it (Linux: /proc/self/status), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def shared_mode(*, directory: bool = False) -> int:
    """The mode a new file (0666) or folder (0777) gets under the current umask."""
    return (0o777 if directory else 0o666) & ~current_umask()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it onto `path` only if the block succeeds.

    With `directory=True` the temporary is a directory (for an LMDB environment, a report folder);
    an existing directory at `path` is replaced.  The temporary has the umask's mode from the start.
    On any exception the temporary is removed and `path` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    os.chmod(tmp, shared_mode(directory=directory))
    try:
        yield tmp
        if directory:
            old = None
            if target.exists():
                old = target.with_name(f".{target.name}.old-{os.getpid()}")
                target.rename(old)
            tmp.rename(target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        else:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        if directory:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically and return the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically and return the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write `obj` as indented, key-sorted JSON to `path` atomically and return the path."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def load_json(path: str | os.PathLike[str], what: str = "file") -> Any:
    """The JSON in `path`; a missing, unreadable or malformed file is an error naming it and `what` it is."""
    path = Path(path)
    try:
        return json.loads(read_user_text(path, what))
    except json.JSONDecodeError as exc:
        raise FirescaleError(f"{what} {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
