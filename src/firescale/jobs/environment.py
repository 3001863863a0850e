"""The environment a job inherits from its submission, with relative search-path entries made absolute.

A job runs in its run folder, on other nodes, so an entry such as `.venv/bin` in the submitting shell's
PATH would point somewhere else there (or nowhere).  Each relative entry of PATH, PYTHONPATH and
LD_LIBRARY_PATH, and a relative VIRTUAL_ENV, is joined to the directory the job is submitted from.  An
empty entry (`PATH=:/usr/bin`, a trailing `:`) means the current directory to the shell, Python and the
dynamic loader alike, so it becomes the submission directory too; a variable set to nothing is passed on
as it is; a leading `~` becomes the home directory.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from firescale.errors import FirescaleError

SEARCH_PATHS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")  # lists of folders, separated by ':'
SINGLE_PATHS = ("VIRTUAL_ENV",)


def absolute_entry(entry: str, submit_dir: Path) -> str:
    """`entry` as an absolute path: a leading `~` is the home directory, the rest is taken from `submit_dir`."""
    if entry.startswith("~"):
        entry = os.path.expanduser(entry)
    return entry if os.path.isabs(entry) else str(submit_dir / entry)


def absolute_value(name: str, value: str, submit_dir: Path) -> str:
    """The value of variable `name` with each of its relative entries made absolute against `submit_dir`."""
    if not value:
        return value
    entries = value.split(":") if name in SEARCH_PATHS else [value]
    absolute = [absolute_entry(entry, submit_dir) for entry in entries]
    if ":" in str(submit_dir) and absolute != entries:
        changed = next(e for e, a in zip(entries, absolute, strict=True) if e != a)
        raise FirescaleError(f"{name} has the relative entry {changed!r}, and the directory it is submitted from, "
                             f"{submit_dir}, contains ':', so it cannot be made absolute; give it as an absolute path")
    return ":".join(absolute)


def submission_environment(environ: Mapping[str, str], submit_dir: Path) -> dict[str, str]:
    """`environ` as a job should inherit it when submitted from `submit_dir` (an absolute path): PATH,
    PYTHONPATH, LD_LIBRARY_PATH and VIRTUAL_ENV with every relative entry made absolute."""
    env = dict(environ)
    for name in (*SEARCH_PATHS, *SINGLE_PATHS):
        if name in env:
            env[name] = absolute_value(name, env[name], submit_dir)
    return env


def job_environment() -> dict[str, str]:
    """This process's environment, as a job it submits from its working directory should inherit it."""
    return submission_environment(os.environ, Path.cwd())
