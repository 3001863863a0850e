"""The Scheduler interface: directives (pure strings) apart from submit, poll and cancel (the only shelling-out)."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import FirescaleError

if TYPE_CHECKING:
    from ..render import JobSpec
    from ..site import SiteProfile

# Normalised job states. GONE: left the queue and no accounting knows it (decide by the status file).
PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, PREEMPTED, CANCELLED, GONE = (
    "PENDING", "RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "PREEMPTED", "CANCELLED", "GONE")
ACTIVE = frozenset({PENDING, RUNNING})


@dataclass(frozen=True)
class JobState:
    """A job's state in the scheduler's words (`raw`) and in ours (`state`)."""

    state: str
    raw: str = ""
    exit_code: int | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str], timeout: float = 120) -> "subprocess.CompletedProcess[str]":
    """Run a scheduler command (sbatch, squeue, qsub, ...). Every call to a scheduler goes through here."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise FirescaleError(f"{argv[0]} not found on PATH; is this a login node of the site's scheduler?") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} did not answer in {timeout:.0f} s")


def prefixed(prefix: Sequence[str], runner: Runner = run_command) -> Runner:
    """A runner that puts `prefix` (a site's client_prefix, e.g. ssh to a login node) before every command."""
    if not prefix:
        return runner
    words = [os.path.expandvars(os.path.expanduser(w)) for w in prefix]
    return lambda argv: runner([*words, *argv])


class Scheduler:
    """Gets the allocation; a Launcher then places ranks inside it."""

    name = "base"
    template = "local.sh.j2"
    # Shell (trusted, from this code, not from profiles) that prints the allocation's hostnames, one a line.
    hosts_command = "hostname"
    # The variable holding the job's id inside the job, if the scheduler sets one.
    job_id_variable = ""

    def __init__(self, runner: Runner = run_command) -> None:
        self.runner = runner

    def directives(self, site: "SiteProfile", job: "JobSpec") -> list[str]:
        """Directive lines (with their prefix), sorted, for the top of the job script."""
        return []

    def submit(self, script: Path, workdir: Path) -> str:
        """Submit `script`; return the job id."""
        raise NotImplementedError

    def poll(self, job_id: str) -> JobState:
        raise NotImplementedError

    def cancel(self, job_id: str) -> None:
        raise NotImplementedError

    def _run(self, argv: Sequence[str], what: str) -> "subprocess.CompletedProcess[str]":
        proc = self.runner(argv)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise FirescaleError(f"{what} failed ({' '.join(argv)}): {detail[-1] if detail else f'exit {proc.returncode}'}")
        return proc
