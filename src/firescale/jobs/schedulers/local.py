"""No scheduler: the job script runs directly on this machine, in its own process group."""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from firescale.errors import FirescaleError
from firescale.jobs.schedulers.base import CANCELLED, COMPLETED, FAILED, GONE, RUNNING, JobState, Scheduler


class Local(Scheduler):
    name = "local"
    template = "local.sh.j2"
    hosts_command = "hostname"
    job_id_variable = ""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._jobs: dict[str, subprocess.Popen[bytes]] = {}
        self._cancelled: set[str] = set()

    def submit_with(self, script: Path, workdir: Path, env: Mapping[str, str]) -> str:
        workdir.mkdir(parents=True, exist_ok=True)
        log = open(workdir / "job.log", "ab")
        try:
            proc = subprocess.Popen(["bash", str(script)], cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=dict(env))
        except OSError as exc:
            raise FirescaleError(f"cannot run {script}: {exc}") from None
        finally:
            log.close()
        job_id = str(proc.pid)
        self._jobs[job_id] = proc
        return job_id

    def poll(self, job_id: str) -> JobState:
        proc = self._jobs.get(job_id)
        if proc is None:
            return JobState(GONE, "not started by this process")
        code = proc.poll()
        if code is None:
            return JobState(RUNNING, "running")
        if job_id in self._cancelled:
            return JobState(CANCELLED, f"exit {code}", code)
        return JobState(COMPLETED if code == 0 else FAILED, f"exit {code}", code)

    def cancel(self, job_id: str) -> None:
        proc = self._jobs.get(job_id)
        if proc is None or proc.poll() is not None:
            return
        self._cancelled.add(job_id)
        # The job body forwards TERM to the ranks, which snapshot; the whole group goes after a grace period.
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
