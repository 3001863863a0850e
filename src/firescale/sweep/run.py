"""Run one sweep point: submit, poll kindly, resubmit from the snapshot after walltime, collect the record."""
from __future__ import annotations

import datetime as dt
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json
from firescale.errors import FirescaleError
from firescale.jobs.outcome import FINISHED_RESULTS, ResubmitRules, Verdict, decide, first_lost_rank, without_progress
from firescale.jobs.schedulers import Scheduler
from firescale.jobs.watch import Polling, cancel_job, gave_up, watch_job
from firescale.sweep.records import PointRecord, write_run_record
from firescale.train.checkpoint import newest_snapshot_iteration


@dataclass
class Submission:
    """One submission of a point's job: when it queued, ran and ended, and how."""

    attempt: int
    job_id: str
    submitted: str
    started: str | None = None
    ended: str | None = None
    queue_s: float | None = None
    state: str = ""
    exit_code: int | None = None
    signal: str = ""


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds_between(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return max(0.0, (dt.datetime.strptime(b, fmt) - dt.datetime.strptime(a, fmt)).total_seconds())


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise FirescaleError(f"{path}: not a readable JSON file ({exc})") from None


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
    except OSError:
        return ""


def site_scheduler(site: Any) -> Scheduler:
    """The scheduler of `site` (a SiteProfile), its commands run through the site's client_prefix."""
    from firescale.jobs.schedulers import get_scheduler, prefixed
    return get_scheduler(site.scheduler, prefixed(site.config["client_prefix"]))


def trained(run_dir: Path) -> bool:
    """Whether a point's job left what it is for: the trainer's finished result.json."""
    result = read_json(run_dir / "result.json")
    return result is not None and result.get("status") in FINISHED_RESULTS


@dataclass
class PointRun:
    """Everything needed to run one point's job (or another job, given what it leaves when done: `finished`,
    and the words for its absence: `missing`); `log` receives one line per submission and state change."""

    scheduler: Scheduler
    script: Path
    run_dir: Path
    max_resubmits: int
    polling: Polling = field(default_factory=Polling)
    log: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    current: str | None = None  # the job id being watched, for cancel_current()
    rules: ResubmitRules = field(default_factory=ResubmitRules)
    finished: Callable[[Path], bool] = trained
    missing: str = "training wrote no finished result.json"

    def run(self) -> tuple[Verdict, list[Submission]]:
        submissions: list[Submission] = []
        for attempt in range(self.max_resubmits + 1):
            before = newest_snapshot_iteration(self.run_dir / "snapshots")
            sub, verdict = self._attempt(attempt)
            submissions.append(sub)
            if verdict.outcome != "resubmit":
                return verdict, submissions
            after = newest_snapshot_iteration(self.run_dir / "snapshots")
            if (stalled := without_progress(verdict, attempt, before, after)) is not None:
                return stalled, submissions
            if attempt < self.max_resubmits:
                self.log(f"{_now()} resubmitting from the snapshot at iteration {after}: {verdict.reason} "
                         f"({attempt + 1} of {self.max_resubmits} resubmissions)")
        return Verdict("failed", f"still unfinished after {self.max_resubmits} resubmissions"), submissions

    def _attempt(self, attempt: int) -> tuple[Submission, Verdict]:
        status_file = self.run_dir / "status.json"
        self.run_dir.mkdir(parents=True, exist_ok=True)  # the scheduler opens the job's log here
        if status_file.exists():  # the previous attempt's; keep it for the record
            status_file.replace(self.run_dir / f"status.attempt-{attempt - 1 if attempt else 'old'}.json")
        job_id = self.scheduler.submit(self.script, self.run_dir)
        sub = Submission(attempt=attempt, job_id=job_id, submitted=_now())
        self.current = job_id
        self.log(f"{sub.submitted} submitted {self.script.name} as job {job_id} (attempt {attempt})")
        stamped = lambda line: self.log(f"{_now()} {line}")  # noqa: E731

        def started() -> None:
            if not sub.started:
                sub.started = _now()

        state = watch_job(self.scheduler, job_id, self.polling, self.sleep, stamped, on_running=started)
        status = self._wait_for_status(status_file) if state.answered else read_json(status_file)
        sub.ended = (status or {}).get("end") or _now()
        if status:
            sub.started = status.get("start") or sub.started
            sub.exit_code = status.get("exit_code")
            sub.signal = status.get("signal", "")
        sub.queue_s = _seconds_between(sub.submitted, sub.started)
        sub.state = state.raw or state.state
        verdict = decide(status, state, self.finished(self.run_dir), self.rules, missing=self.missing)
        if gave_up(state, status):
            verdict.reason += "; " + cancel_job(self.scheduler, job_id, self.polling, self.sleep, stamped)
        if verdict.outcome == "failed" and not (status or {}).get("reason"):  # else the job said why itself
            if lost := first_lost_rank(log_tail(self.run_dir / "job.log", 400)):
                verdict.reason += f"; the launcher lost {lost} first"
        self.log(f"{_now()} job {job_id}: {verdict.outcome}" + (f" ({verdict.reason})" if verdict.reason else ""))
        self.current = None
        return sub, verdict

    def _wait_for_status(self, status_file: Path) -> dict[str, Any] | None:
        waited = 0.0
        while (status := read_json(status_file)) is None and waited < self.polling.status_wait:
            self.sleep(1.0)
            waited += 1.0
        return status

    def cancel_current(self) -> None:
        job_id = self.current
        if job_id:
            self.log(f"{_now()} cancelling job {job_id}")
            try:
                self.scheduler.cancel(job_id)
            except FirescaleError as exc:
                self.log(f"{_now()} could NOT cancel job {job_id} ({exc}); cancel it by hand")


def collect(point: PointRecord, verdict: Verdict, submissions: list[Submission], run_dir: Path,
            result_out: Path, status_out: Path) -> dict[str, Any]:
    """Write the point's run record (and the job's status file) where the workflow expects them."""
    status = read_json(run_dir / "status.json")
    train = read_json(run_dir / "result.json") if verdict.outcome == "succeeded" else None
    atomic_write_json(status_out, status if status is not None else {"exit_code": None, "reason": verdict.reason})
    return write_run_record(
        result_out, point, verdict.outcome, verdict.reason,
        log_tail="" if verdict.outcome == "succeeded" else log_tail(run_dir / "job.log"),
        submissions=[asdict(s) for s in submissions], train=train, status=status)


def install_cancel_handlers(run: PointRun) -> None:
    """Ctrl-C or a TERM from Snakemake cancels the submitted job before this process ends."""

    def handler(signum, frame):  # noqa: ARG001
        run.cancel_current()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def run_watched(job: PointRun, lock: Any) -> tuple[Verdict, list[Submission]]:
    """Run `job` while holding its run folder's `lock` (refreshed at every wait); Ctrl-C or a TERM cancels the
    submitted job, says so and raises KeyboardInterrupt (the command line's exit status 130)."""
    def sleep(seconds: float) -> None:
        lock.refresh()
        time.sleep(seconds)

    job.sleep = sleep
    install_cancel_handlers(job)
    try:
        return job.run()
    except KeyboardInterrupt:
        print("firescale: the submitted job was cancelled", file=sys.stderr)
        raise
