"""Which code ran: the git commit of a checkout, and of the one this package was imported from."""
from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any


def git_state(repo: str | Path) -> dict[str, Any]:
    """The commit checked out at `repo` and whether the tree has uncommitted changes ('unknown' if no git)."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"repository": str(repo), "commit": "unknown", "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"repository": str(repo), "commit": commit, "dirty": None if status is None else bool(status)}


@cache
def source_commit() -> dict[str, str]:
    """{'commit': sha} of the checkout firescale runs from (an editable install), with '+dirty' when its
    tracked files have changes; {} for an installed package or a node without git."""
    state = git_state(Path(__file__).resolve().parent)
    if state["commit"] == "unknown":
        return {}
    return {"commit": state["commit"] + ("+dirty" if state["dirty"] else "")}
