"""Atomic writes of report files with ordinary permissions (a web server or a colleague may read them)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from firescale.atomic import atomic_path


def publish(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary sibling (readable as the umask allows), rename it onto `path`."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def publish_text(path: str | Path, text: str) -> Path:
    return publish(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def publish_json(path: str | Path, obj: Any) -> Path:
    return publish_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
