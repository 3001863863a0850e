"""One cpuset cgroup (v1 hierarchy) per compute node, so that each node owns one real core; skipped where
the hierarchy is absent or not writable (the nodes' `enter` then pins by CPU affinity)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")


def make_cpusets(top: Path, cores: Mapping[str, int]) -> None:
    """The cgroup `top` over every core, and in it one child per node holding only that node's core."""
    if not (CPUSET_ROOT / "cpuset.cpus").is_file() or not os.access(CPUSET_ROOT, os.W_OK):
        return
    mems = (CPUSET_ROOT / "cpuset.mems").read_text().strip()
    top.mkdir(exist_ok=True)
    (top / "cpuset.cpus").write_text((CPUSET_ROOT / "cpuset.cpus").read_text().strip())
    (top / "cpuset.mems").write_text(mems)
    for node, core in cores.items():
        (top / node).mkdir(exist_ok=True)
        (top / node / "cpuset.cpus").write_text(str(core))
        (top / node / "cpuset.mems").write_text(mems)


def remove_cpusets(top: Path) -> None:
    """Remove `top` and its children (a cgroup still holding a process stays)."""
    nodes = [p for p in top.iterdir() if p.is_dir()] if top.is_dir() else []
    for folder in [*nodes, top]:
        with contextlib.suppress(OSError):
            folder.rmdir()
