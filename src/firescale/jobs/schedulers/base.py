"""The Scheduler interface: directives (pure strings) apart from submit, poll and cancel (the only shelling-out)."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from firescale.errors import FirescaleError
from firescale.jobs.environment import job_environment

if TYPE_CHECKING:
    from firescale.cluster.site import SiteProfile
    from firescale.jobs.spec import JobSpec

# Normalised job states.  GONE: the scheduler answered, and neither its queue nor its accounting knows
# the job (decide by the status file).  UNKNOWN: the scheduler did not answer (a failed or timed-out
# squeue, sacct or qstat); it says nothing about the job, so the runner asks again.  STALLED: the runner's
# own word for a running job whose heartbeat shows no progress (jobs/stall.py); it cancels the job.
PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, PREEMPTED, CANCELLED, GONE = (
    "PENDING", "RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "PREEMPTED", "CANCELLED", "GONE")
NODE_FAIL, OUT_OF_MEMORY, UNKNOWN, STALLED = "NODE_FAIL", "OUT_OF_MEMORY", "UNKNOWN", "STALLED"
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

    @property
    def answered(self) -> bool:
        """False when the scheduler's commands failed, so this is no word about the job."""
        return self.state != UNKNOWN

    def words(self) -> str:
        """The state for people: ours, with the scheduler's own words when they say more."""
        return self.state + (f" ({self.raw})" if self.raw and self.raw != self.state else "")


class Runner(Protocol):
    """Runs a scheduler command; `env` (a submission's environment) replaces this process's when given."""

    def __call__(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
                 ) -> subprocess.CompletedProcess[str]: ...


def run_command(argv: Sequence[str], env: Mapping[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command (sbatch, squeue, qsub, ...). Every call to a scheduler goes through here."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else dict(env))
    except FileNotFoundError:
        raise FirescaleError(f"{argv[0]} not found on PATH; is this a login node of the site's scheduler?") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} did not answer in {timeout:.0f} s")


def prefixed(prefix: Sequence[str], runner: Runner = run_command) -> Runner:
    """A runner that puts `prefix` (a site's client_prefix, e.g. ssh to a login node) before every command."""
    if not prefix:
        return runner
    words = [os.path.expandvars(os.path.expanduser(w)) for w in prefix]
    return lambda argv, env=None: runner([*words, *argv], env)


class Scheduler:
    """Gets the allocation; a Launcher then places ranks inside it."""

    name = "base"
    template = "local.sh.j2"
    # Shell (trusted, from this code, not from profiles) that prints the allocation's hostnames, one a line.
    hosts_command = "hostname"
    # The variable holding the job's id inside the job, if the scheduler sets one.
    job_id_variable = ""
    # The most characters of a job name the scheduler keeps (None: more than firescale writes, as Slurm).
    name_length: int | None = None

    def __init__(self, runner: Runner = run_command) -> None:
        self.runner = runner

    def inside_job(self) -> bool:
        """Whether this process runs inside one of this scheduler's jobs (its job id variable is set)."""
        return bool(self.job_id_variable and os.environ.get(self.job_id_variable))

    def directives(self, site: SiteProfile, job: JobSpec) -> list[str]:
        """Directive lines (with their prefix), sorted, for the top of the job script."""
        return []

    def walltime_timer(self, site: SiteProfile, job: JobSpec) -> int | None:
        """Seconds after its start at which the job signals itself that walltime is near, when the
        scheduler cannot be asked to (None: the scheduler sends the signal, or there is no walltime)."""
        return None

    def submit(self, script: Path, workdir: Path) -> str:
        """Submit `script` to run in `workdir`; return the job id.  The job inherits this process's
        environment with its relative search paths made absolute against the working directory
        (`jobs.environment`): it runs in `workdir`, maybe on other nodes, where they would point elsewhere."""
        return self.submit_with(script, workdir, job_environment())

    def submit_with(self, script: Path, workdir: Path, env: Mapping[str, str]) -> str:
        """Submit `script` with the environment `env` (what the scheduler passes on to the job); return the job id."""
        raise NotImplementedError

    def poll(self, job_id: str) -> JobState:
        """The job's state; UNKNOWN when the scheduler's commands failed (never a guess)."""
        raise NotImplementedError

    def cancel(self, job_id: str) -> None:
        """Cancel the job; a job that already ended is no error.  Raises FirescaleError if the scheduler refuses."""
        raise NotImplementedError

    def _run(self, argv: Sequence[str], what: str,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = self.runner(argv, env)
        if proc.returncode != 0:
            raise FirescaleError(f"{what} failed ({' '.join(argv)}): {last_line(proc)}")
        return proc


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line a command printed (its error, usually), or its exit code."""
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"exit {proc.returncode}"


def says(proc: subprocess.CompletedProcess[str], *phrases: str) -> bool:
    """Whether the command's output contains one of `phrases` (case-insensitive)."""
    text = f"{proc.stdout or ''}\n{proc.stderr or ''}".lower()
    return any(p.lower() in text for p in phrases)
