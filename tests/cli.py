"""Running one firescale command as a user would, in its own process, for the tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_firescale(*args: object, cwd: str | os.PathLike[str] = REPO, timeout: float = 600,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m firescale ARGS` from `cwd` (the checkout), its output captured; TensorFlow's info lines off."""
    return subprocess.run([sys.executable, "-m", "firescale", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**(env or os.environ), "TF_CPP_MIN_LOG_LEVEL": "2"})
