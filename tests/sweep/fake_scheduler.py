"""A fake Slurm and PBS for unit tests: stand-ins for sbatch/squeue/sacct/scancel and qsub/qstat/qdel.

Each submitted job walks through the states the test scripted, one per successful queue query; on
reaching its last state the fake "job" writes the status file, result and snapshot the test gave it, as a
real job script would, and leaves the queue (only accounting, or PBS Pro's history, then knows it).
Queries can be made to fail (a controller that does not answer), with the messages the real commands print.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SLURM_DOWN = "squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
SACCT_DOWN = "sacct: error: slurmdbd: Unable to contact slurmdbd (connect failure)"
PBS_DOWN = "Connection refused\nqstat: cannot connect to server pbs-server (errno=111)"


@dataclass
class FakeJob:
    states: list[str]                   # scheduler's words, one per answered poll (PENDING, RUNNING, COMPLETED)
    status: dict | None = None          # what the job writes to status.json when it ends (None: nothing)
    result: dict | None = None          # what training writes to result.json (None: nothing)
    accounting: bool = True             # does sacct / qstat -x know it once it left the queue?
    snapshot: int | None = None         # the iteration of the snapshot the job leaves (None: none)
    exit_status: int | None = None      # the scheduler's exit status (default: the status file's exit code)
    failing_queries: set[int] = field(default_factory=set)  # which queue queries (0, 1, ...) fail
    failing_sacct: set[int] = field(default_factory=set)    # which sacct calls fail
    polls: int = 0
    queries: int = 0
    sacct_calls: int = 0
    cancelled: bool = False
    cancelled_state: str = "CANCELLED"  # what the scheduler says of the job once cancelled


@dataclass
class FakeScheduler:
    run_dir: Path
    script: list[FakeJob] = field(default_factory=list)   # jobs handed out in submission order
    calls: list[list[str]] = field(default_factory=list)
    envs: list[dict | None] = field(default_factory=list)   # the environment each call was given (None: ours)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    submit_fails: bool = False
    cancel_failures: int = 0           # how many cancel commands fail before one works

    def __call__(self, argv, env=None):
        argv = list(argv)
        self.calls.append(argv)
        self.envs.append(None if env is None else dict(env))
        return getattr(self, f"_{argv[0]}")(argv)

    def _done(self, out="", code=0, err=""):
        return subprocess.CompletedProcess([], code, out, err)

    def _new_job(self) -> str:
        if self.submit_fails:
            return ""
        job = self.script.pop(0)
        job_id = str(1000 + len(self.jobs))
        self.jobs[job_id] = job
        return job_id

    def _query_fails(self, job: FakeJob) -> bool:
        index = job.queries
        job.queries += 1
        return index in job.failing_queries

    def _advance(self, job: FakeJob) -> str | None:
        """The job's current state, or None when it has left the queue."""
        if job.cancelled:
            return job.cancelled_state
        index = job.polls
        job.polls += 1
        if index < len(job.states) - 1:
            return None if job.states[index] == "GONE" else job.states[index]  # GONE: a moment's absence
        if index == len(job.states) - 1:
            self._finish(job)
        return None

    def _finish(self, job: FakeJob) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if job.status is not None:
            (self.run_dir / "status.json").write_text(json.dumps(job.status))
        if job.result is not None:
            (self.run_dir / "result.json").write_text(json.dumps(job.result))
        if job.snapshot is not None:
            (self.run_dir / "snapshots").mkdir(exist_ok=True)
            (self.run_dir / "snapshots" / f"snapshot_iter_{job.snapshot}.npz").write_bytes(b"")

    def _cancel(self, job_id: str, command: str):
        if self.cancel_failures:
            self.cancel_failures -= 1
            return self._done(code=1, err=f"{command}: error: Unable to contact the controller (connect failure)")
        self.cancelled.append(job_id)
        if job_id in self.jobs:
            self.jobs[job_id].cancelled = True
        return self._done()

    def _exit_status(self, job: FakeJob) -> int:
        return job.exit_status if job.exit_status is not None else (job.status or {}).get("exit_code", 0)

    # Slurm
    def _sbatch(self, argv):
        job_id = self._new_job()
        if job_id:
            return self._done(f"{job_id};cluster\n")
        return self._done(code=1, err="sbatch: error: Batch job submission failed: Invalid account")

    def _squeue(self, argv):
        job = self.jobs[argv[argv.index("--jobs") + 1]]
        if self._query_fails(job):
            return self._done(code=1, err=SLURM_DOWN)
        state = self._advance(job)
        if state is None:  # what squeue says once the job is purged from the controller
            return self._done(code=1, err="slurm_load_jobs error: Invalid job id specified")
        return self._done(f"{state}\n")

    def _sacct(self, argv):
        job = self.jobs[argv[argv.index("--jobs") + 1]]
        index = job.sacct_calls
        job.sacct_calls += 1
        if index in job.failing_sacct:
            return self._done(code=1, err=SACCT_DOWN)
        if not job.accounting:
            return self._done(code=1, err="Slurm accounting storage is disabled")
        return self._done(f"{job.states[-1]}|{self._exit_status(job)}:0\n")

    def _scancel(self, argv):
        return self._cancel(argv[1], "scancel")

    # PBS / Torque
    def _qsub(self, argv):
        job_id = self._new_job()
        return self._done(f"{job_id}.pbs-server\n") if job_id else self._done(code=1, err="qsub: Unauthorized Request")

    def _qstat(self, argv):
        job_id = argv[-1].split(".")[0]
        job = self.jobs[job_id]
        if "-x" in argv:
            if not job.accounting:
                return self._done(code=153, err=f"qstat: Unknown Job Id {argv[-1]}")
            return self._done(f"Job Id: {argv[-1]}\n    job_state = {job.states[-1]}\n"
                              f"    Exit_status = {self._exit_status(job)}\n")
        if self._query_fails(job):
            return self._done(code=1, err=PBS_DOWN)
        state = self._advance(job)
        if state is None:
            return self._done(code=153, err=f"qstat: Unknown Job Id {argv[-1]}")
        return self._done(f"Job Id: {argv[-1]}\n    Job_Name = fs\n    job_state = {state}\n")

    def _qdel(self, argv):
        return self._cancel(argv[1], "qdel")
