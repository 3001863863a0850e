"""Running a command as N Open MPI ranks on this machine, for the tests."""
from __future__ import annotations

import os
import shutil


def mpirun_argv(n: int, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """argv that runs `argv` as `n` Open MPI ranks on this machine (as root too)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun is not installed; run `make setup`")
    cmd = [mpirun, "-np", str(n), "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key in sorted(env or {}):
        cmd += ["-x", f"{key}={env[key]}"]
    return cmd + argv
