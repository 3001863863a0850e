"""Run one sweep point: submit, poll kindly, cancel a stalled job, resubmit from the snapshot after walltime or a
stall, collect the record."""
from __future__ import annotations

import datetime as dt
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json, load_json
from firescale.errors import FirescaleError
from firescale.jobs.heartbeat import clear_beats
from firescale.jobs.outcome import FINISHED_RESULTS, ResubmitRules, Verdict, decide, first_lost_rank, without_progress
from firescale.jobs.schedulers import Scheduler
from firescale.jobs.schedulers.base import NODE_FAIL, OUT_OF_MEMORY, STALLED, UNKNOWN, JobState
from firescale.jobs.stall import Stall, StallWatch, default_stall_after
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
    stall: dict[str, Any] | None = None   # state STALLED: what stopped (jobs.stall.Stall.to_dict), or who gave up


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
    and the words for its absence: `missing`); `log` receives one line per submission and state change.
    With `stall` (a training job's heartbeat watch), a running job that stalls is cancelled and resubmitted."""

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
    stall: StallWatch | None = None

    def run(self) -> tuple[Verdict, list[Submission]]:
        submissions: list[Submission] = []
        for attempt in range(self.max_resubmits + 1):
            before = newest_snapshot_iteration(self.run_dir / "snapshots")
            sub, verdict = self._attempt(attempt)
            submissions.append(sub)
            if verdict.outcome != "resubmit":
                return verdict, submissions
            after = newest_snapshot_iteration(self.run_dir / "snapshots")
            if (repeated := self._repeats(submissions, verdict, attempt, before, after)) is not None:
                return repeated, submissions
            if attempt < self.max_resubmits:
                origin = "the start (no snapshot yet)" if after is None else f"the snapshot at iteration {after}"
                self.log(f"{_now()} resubmitting from {origin}: {verdict.reason} "
                         f"({attempt + 1} of {self.max_resubmits} resubmissions)")
        return Verdict("failed", f"still unfinished after {self.max_resubmits} resubmissions"), submissions

    @staticmethod
    def _repeats(submissions: list[Submission], verdict: Verdict, attempt: int, before: int | None,
                 after: int | None) -> Verdict | None:
        """A failed verdict when resubmitting would repeat this attempt, else None: a walltime's attempt must leave
        a newer snapshot; a stalled one, unless it did, must not have stalled at the iteration the one before it did
        (a hang that comes back at the same place is no passing fault)."""
        sub = submissions[-1]
        if sub.state != STALLED or (after is not None and (before is None or after > before)):
            return without_progress(verdict, attempt, before, after)
        last = lambda s: (s.stall or {}).get("last_iteration")  # noqa: E731
        if len(submissions) < 2 or submissions[-2].state != STALLED or last(submissions[-2]) != last(sub):
            return None
        return Verdict("failed", f"{verdict.reason.split('; ')[0]}; attempts {attempt - 1} and {attempt} both stalled "
                                 f"at iteration {last(sub)} with no newer snapshot, so the point stops here")

    def _polling(self) -> Polling:
        """How often to look: with a stall watch, at least every half stall_after (a stall is seen within
        stall_after and one poll)."""
        if self.stall is None:
            return self.polling
        return replace(self.polling, most=min(self.polling.most, max(self.polling.first, self.stall.stall_after / 2)))

    def _attempt(self, attempt: int) -> tuple[Submission, Verdict]:
        status_file = self.run_dir / "status.json"
        self.run_dir.mkdir(parents=True, exist_ok=True)  # the scheduler opens the job's log here
        if status_file.exists():  # the previous attempt's; keep it for the record
            status_file.replace(self.run_dir / f"status.attempt-{attempt - 1 if attempt else 'old'}.json")
        if self.stall is not None:   # the previous attempt's heartbeats say nothing of this one
            clear_beats(self.run_dir)
            self.stall.reset()
        job_id = self.scheduler.submit(self.script, self.run_dir)
        sub = Submission(attempt=attempt, job_id=job_id, submitted=_now())
        self.current = job_id
        self.log(f"{sub.submitted} submitted {self.script.name} as job {job_id} (attempt {attempt})")
        stamped = lambda line: self.log(f"{_now()} {line}")  # noqa: E731

        def started() -> None:
            if not sub.started:
                sub.started = _now()

        found: list[Stall] = []
        state = watch_job(self.scheduler, job_id, self._polling(), self.sleep, stamped, on_running=started,
                          check=self._stall_check(found))
        stall = found[0] if state.state == STALLED else None
        cancelled = ""
        if stall is not None:   # cancelled, and watched until the scheduler says it ended
            stamped(f"job {job_id}: STALLED: {stall.words()}")
            cancelled = cancel_job(self.scheduler, job_id, self.polling, self.sleep, stamped)
            state = watch_job(self.scheduler, job_id, self.polling, self.sleep, stamped)
        status = self._wait_for_status(status_file) if state.answered and not stall else read_json(status_file)
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
        if stall is not None:
            return self._decided(sub, self._stalled(sub, stall, state, verdict, cancelled))
        if verdict.outcome == "failed" and self.stall is not None:
            verdict = self._collective_gave_up(sub, verdict)
        if verdict.outcome == "failed" and not (status or {}).get("reason"):  # else the job said why itself
            if lost := first_lost_rank(log_tail(self.run_dir / "job.log", 400)):
                verdict.reason += f"; the launcher lost {lost} first"
        return self._decided(sub, verdict)

    def _decided(self, sub: Submission, verdict: Verdict) -> tuple[Submission, Verdict]:
        self.log(f"{_now()} job {sub.job_id}: {verdict.outcome}" + (f" ({verdict.reason})" if verdict.reason else ""))
        self.current = None
        return sub, verdict

    def _stall_check(self, found: list[Stall]) -> Any:
        """The watcher's look at the heartbeat: the stall's words (and the stall kept in `found`), or None."""
        watch = self.stall
        if watch is None:
            return None

        def check() -> str | None:
            stall = watch.check()
            if stall is None:
                return None
            found.append(stall)
            return stall.words()
        return check

    @staticmethod
    def _stalled(sub: Submission, stall: Stall, state: JobState, verdict: Verdict, cancelled: str) -> Verdict:
        """The verdict on a job cancelled as stalled: STALLED, resubmitted from the newest snapshot; unless it
        finished meanwhile, the scheduler knows a cause of its own (a node failed, memory ran out), or it stopped
        answering (then nobody knows whether the job still runs)."""
        sub.stall = {**stall.to_dict(), "scheduler_state": sub.state}
        if verdict.outcome == "succeeded" or state.state in (NODE_FAIL, OUT_OF_MEMORY, UNKNOWN):
            verdict.reason += ("; " if verdict.reason else "") + f"the job had stalled ({stall.words()}); {cancelled}"
            return verdict
        sub.state = STALLED
        return Verdict("resubmit", f"STALLED: {stall.words()}; {cancelled}; resuming from the newest snapshot")

    def _collective_gave_up(self, sub: Submission, verdict: Verdict) -> Verdict:
        """A job that failed because a rank's collective gave up waiting for a peer stalled: resubmit it.  Another
        failure that a rank's heartbeat explains gets its words."""
        assert self.stall is not None
        gave = self.stall.gave_up()   # reads the ranks' last heartbeats
        if gave:
            words = "; ".join(f"{b.where} at iteration {b.iteration}: {b.error}" for b in gave)
            sub.stall = {"gave_up": [b.to_dict() for b in gave], "last_iteration": max(b.iteration for b in gave),
                         "scheduler_state": sub.state}
            sub.state = STALLED
            return Verdict("resubmit", f"STALLED: {words}; resuming from the newest snapshot")
        failed = [b for b in self.stall.beats().values() if b.error]
        if failed:
            verdict.reason += "; " + "; ".join(f"{b.where} failed at iteration {b.iteration}: {b.error}"
                                               for b in failed)
        return verdict

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


def stall_watch(point: PointRecord, site: Any, prediction: Path | None) -> tuple[StallWatch | None, str]:
    """The heartbeat watch of a training point, and the words for its stall_after: the point's own (the
    experiment's or the site's, 0 for none), else from its prediction (predict.json) with the site's floor."""
    run_dir = Path(point.run_dir)
    if point.stall_after is not None:
        if point.stall_after == 0:
            return None, "no stall watch (stall_after 0)"
        return StallWatch(run_dir, point.stall_after), f"stall_after {point.stall_after:g} s (the point's own)"
    floor = site.stall_after_floor
    entry = None
    if prediction is not None:
        data = load_json(prediction, "prediction")
        entry = ((data or {}).get("points") or {}).get(point.point) if isinstance(data, dict) else None
    after = default_stall_after(entry, floor)
    if entry is None:
        return StallWatch(run_dir, after), f"stall_after {after:g} s (the site's floor; no prediction of the point)"
    return StallWatch(run_dir, after), (f"stall_after {after:g} s (from the prediction: iterations of "
                                        f"{float(entry.get('iteration_s') or 0):.3g} s; at least {floor:g} s)")


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
