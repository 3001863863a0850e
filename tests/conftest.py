"""Shared fixtures: the repository root, and running a command as N MPI ranks on localhost."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpitools import mpirun_argv

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def run_ranks():
    """Run `firescale ARGS...` (or any argv starting with an executable path) as N ranks.

    Returns the CompletedProcess; raises with the output when the ranks fail.
    """

    def run(n: int, args: list[str], *, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = args if args and os.path.isabs(args[0]) else [sys.executable, "-m", "firescale", *args]
        full_env = {"OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1",
                    "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        proc = subprocess.run(mpirun_argv(n, argv, full_env), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env={**os.environ, **full_env})
        if check and proc.returncode != 0:
            raise AssertionError(f"{n} ranks of {args} exited {proc.returncode}\n"
                                 f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
        return proc

    return run
