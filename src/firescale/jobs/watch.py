"""Watching one job: poll kindly, ask again when the scheduler does not answer, believe an end only when it repeats.

A failed `squeue`, `sacct` or `qstat` says nothing about the job (state UNKNOWN): the watcher asks again
with backoff and gives up only after `give_up_after` seconds of silence, and then the job is cancelled,
never left running unwatched.  An ended state must be answered `confirm` times in a row (a job that
neither the queue nor accounting knows, GONE, once more) before the runner acts on it.  While the job runs,
`check` (the runner's look at the job's heartbeat, jobs/stall.py) may end the watch: STALLED, with its words.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from firescale.errors import FirescaleError
from firescale.jobs.schedulers.base import GONE, RUNNING, STALLED, UNKNOWN, JobState, Scheduler

if TYPE_CHECKING:
    from firescale.cluster.site import SiteProfile


@dataclass
class Polling:
    """How often to ask the scheduler: start at `first` seconds, grow by `factor`, never above `most`."""

    first: float = 10.0
    factor: float = 1.5
    most: float = 120.0
    status_wait: float = 60.0     # how long a finished job's status file may take to appear (shared FS)
    confirm: int = 2              # answers in a row that must agree before an end is believed (GONE: one more)
    give_up_after: float = 1800.0  # seconds of unanswered queries before the job is cancelled
    cancel_tries: int = 5         # attempts at cancelling a job the runner gives up on

    @classmethod
    def for_site(cls, site: SiteProfile, first: float | None = None) -> Polling:
        """How a runner polls `site`'s jobs, from `first` seconds (else the site's poll_seconds).  A scheduler
        is asked ever less often, from 10 s by default; a local job is looked at steadily, every second by
        default, so that a short job's end is seen within a second rather than a third of its run time later."""
        here = site.scheduler == "local"
        first = first or site.config["poll_seconds"] or (1.0 if here else 10.0)
        return cls(first=first, factor=1.0, most=first) if here else cls(first=first)


@dataclass
class _Tally:
    """The watcher's memory between polls."""

    interval: float
    retry: float
    silent: float = 0.0
    candidate: str = ""
    agreeing: int = 0
    last_words: str = ""
    first_error: str = ""


def watch_job(scheduler: Scheduler, job_id: str, polling: Polling, sleep: Callable[[float], None],
              log: Callable[[str], None], on_running: Callable[[], Any] = lambda: None,
              check: Callable[[], str | None] | None = None) -> JobState:
    """Poll until the job has ended (confirmed), the scheduler stayed silent too long (UNKNOWN), or `check`,
    asked at every poll that finds the job running, said why it stalled (STALLED)."""
    t = _Tally(interval=polling.first, retry=polling.first)
    while True:
        state = scheduler.poll(job_id)
        if not state.answered:
            if t.silent >= polling.give_up_after:
                return JobState(UNKNOWN, f"no answer for {t.silent:.0f} s (first: {t.first_error}; last: {state.raw})")
            if not t.silent:
                t.first_error = state.raw
                log(f"job {job_id}: the scheduler did not answer ({state.raw}); asking again with backoff")
            sleep(t.retry)
            t.silent += t.retry
            t.retry = min(polling.most, t.retry * polling.factor)
            continue
        if t.silent:
            log(f"job {job_id}: the scheduler answers again after {t.silent:.0f} s")
        t.silent, t.retry = 0.0, polling.first
        if state.words() != t.last_words:
            log(f"job {job_id}: {state.words()}")
            t.last_words = state.words()
        if state.state == RUNNING:
            on_running()
            if check is not None and (stalled := check()) is not None:
                return JobState(STALLED, stalled)
        if state.active:
            t.candidate, t.agreeing = "", 0
            sleep(t.interval)
            t.interval = min(polling.most, t.interval * polling.factor)
            continue
        t.agreeing = t.agreeing + 1 if state.state == t.candidate else 1
        t.candidate = state.state
        if t.agreeing >= polling.confirm + (1 if state.state == GONE else 0):
            return state
        sleep(polling.first)  # a second look before acting on an end


def cancel_job(scheduler: Scheduler, job_id: str, polling: Polling, sleep: Callable[[float], None],
               log: Callable[[str], None]) -> str:
    """Cancel a job the runner gives up on, retrying with backoff; the sentence says how it went."""
    wait, error = polling.first, ""
    for attempt in range(max(1, polling.cancel_tries)):
        try:
            scheduler.cancel(job_id)
        except FirescaleError as exc:
            error = str(exc)
            log(f"job {job_id}: cancel attempt {attempt + 1} failed: {error}")
            sleep(wait)
            wait = min(polling.most, wait * polling.factor)
            continue
        log(f"job {job_id}: cancelled")
        return f"job {job_id} was cancelled so that it does not run unwatched"
    return f"job {job_id} could NOT be cancelled ({error}); cancel it by hand"


def gave_up(state: JobState, status: dict[str, Any] | None) -> bool:
    """Whether the runner stops watching without knowing that the job ended (then it cancels it)."""
    return state.state == UNKNOWN or (state.state == GONE and status is None)
