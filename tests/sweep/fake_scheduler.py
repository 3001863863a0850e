"""A fake Slurm and PBS for unit tests: stand-ins for sbatch/squeue/sacct/scancel and qsub/qstat/qdel.

Each submitted job walks through the states the test scripted; on reaching its last state the fake
"job" writes the status file (and result) the test gave it, as a real job script would.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FakeJob:
    states: list[str]                   # scheduler's words, one per poll, e.g. ["PENDING", "RUNNING", "COMPLETED"]
    status: dict | None = None          # what the job writes to status.json when it ends (None: nothing)
    result: dict | None = None          # what training writes to result.json (None: nothing)
    accounting: bool = True             # does sacct / qstat -x know it once it left the queue?
    polls: int = 0


@dataclass
class FakeScheduler:
    run_dir: Path
    script: list[FakeJob] = field(default_factory=list)   # jobs handed out in submission order
    calls: list[list[str]] = field(default_factory=list)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    submit_fails: bool = False

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        cmd = argv[0]
        handler = getattr(self, f"_{cmd}")
        return handler(argv)

    def _done(self, out="", code=0, err=""):
        return subprocess.CompletedProcess([], code, out, err)

    def _new_job(self) -> str:
        if self.submit_fails:
            return ""
        job = self.script.pop(0)
        job_id = str(1000 + len(self.jobs))
        self.jobs[job_id] = job
        return job_id

    def _advance(self, job_id: str) -> tuple[FakeJob, str | None]:
        """The job's current state, or None when it has left the queue."""
        job = self.jobs[job_id]
        index = job.polls
        job.polls += 1
        if index < len(job.states) - 1:
            return job, job.states[index]
        if index == len(job.states) - 1:
            self._finish(job)
        return job, None

    def _finish(self, job: FakeJob) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if job.status is not None:
            (self.run_dir / "status.json").write_text(json.dumps(job.status))
        if job.result is not None:
            (self.run_dir / "result.json").write_text(json.dumps(job.result))

    # Slurm
    def _sbatch(self, argv):
        job_id = self._new_job()
        return self._done(f"{job_id};cluster\n") if job_id else self._done(code=1, err="sbatch: error: Batch job submission failed: Invalid account")

    def _squeue(self, argv):
        job, state = self._advance(argv[argv.index("--jobs") + 1])
        return self._done(f"{state}\n" if state else "")

    def _sacct(self, argv):
        job = self.jobs[argv[argv.index("--jobs") + 1]]
        if not job.accounting:
            return self._done("")
        code = (job.status or {}).get("exit_code", 0)
        return self._done(f"{job.states[-1]}|{code}:0\n")

    def _scancel(self, argv):
        self.cancelled.append(argv[1])
        return self._done()

    # PBS / Torque
    def _qsub(self, argv):
        job_id = self._new_job()
        return self._done(f"{job_id}.pbs-server\n") if job_id else self._done(code=1, err="qsub: Unauthorized Request")

    def _qstat(self, argv):
        job_id = argv[-1].split(".")[0]
        if "-x" in argv:
            job = self.jobs[job_id]
            if not job.accounting:
                return self._done(code=153, err=f"qstat: Unknown Job Id {argv[-1]}")
            code = (job.status or {}).get("exit_code", 0)
            return self._done(f"Job Id: {argv[-1]}\n    job_state = {job.states[-1]}\n    exit_status = {code}\n")
        job, state = self._advance(job_id)
        if state is None:
            return self._done(code=153, err=f"qstat: Unknown Job Id {argv[-1]}")
        return self._done(f"Job Id: {argv[-1]}\n    Job_Name = fs\n    job_state = {state}\n")

    def _qdel(self, argv):
        self.cancelled.append(argv[1])
        return self._done()
