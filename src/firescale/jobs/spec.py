"""One job as the schedulers and the renderer see it: N ranks of one command, its log and status file."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class JobSpec:
    """One job: N ranks of one command (or one process in an allocation for N ranks), with where its log and
    status file go."""

    name: str
    ranks: int
    walltime_s: int
    command: Sequence[str]
    workdir: Path
    log_file: Path
    status_file: Path
    env: Mapping[str, str] = field(default_factory=dict)
    devices_per_rank: int = 1   # a replica split over D devices: one rank per D of a node's GPUs
    # The command runs once, on the job's first node, and starts its own steps on the allocation (a
    # calibration's measurements); otherwise once for each rank, through the site's launcher.
    one_process: bool = False
    # The backend the job's ranks train or measure with: a GPU site's job checks Horovod's build before a
    # tensorflow job only (a pytorch job sums over torch.distributed, with no Horovod to check).
    framework: str = DEFAULT_FRAMEWORK

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise FirescaleError(f"job name {self.name!r}: use letters, digits and _.- only")
        if int(self.ranks) < 1:
            raise FirescaleError(f"job {self.name}: ranks must be at least 1, got {self.ranks}")
        if int(self.devices_per_rank) < 1:
            raise FirescaleError(f"job {self.name}: devices per rank must be at least 1, got {self.devices_per_rank}")
        if int(self.walltime_s) < 1:
            raise FirescaleError(f"job {self.name}: walltime must be positive, got {self.walltime_s} s")
        for key in self.env:
            if not SHELL_NAME.fullmatch(key):
                raise FirescaleError(f"job {self.name}: environment variable name {key!r} is not a shell name")
