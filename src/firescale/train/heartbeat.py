"""The trainer's heartbeat: a thread rewrites this rank's heartbeat file every few seconds (jobs/heartbeat.py).

The training loop only moves the numbers the heartbeat holds (the phase, the iteration, the steps within the
phase): two attribute stores an iteration, nothing written, nothing waited for.  The thread writes them, atomically,
every `interval_s` seconds and at once when the phase changes, so a rank's file keeps changing while its process
lives, and its numbers change while it progresses.  A process that is stopped (SIGSTOP), or hung in the kernel,
stops both; a rank that waits in a collective keeps beating with the same numbers.

The heartbeat never makes the run folder: a run whose inputs are refused (a damaged --weights, a net that does not
fit the dataset) leaves no folder behind.  Until the trainer makes it (or the runner has, as a sweep's does), the
thread writes nothing; a start-up without beats is never a stall (jobs/stall.py).
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from firescale.errors import FirescaleError
from firescale.jobs.heartbeat import DEFAULT_INTERVAL_S, INTERVAL_VARIABLE, PHASES, RankBeat, write_beat


def heartbeat_interval(env: dict[str, str] | None = None) -> float:
    """Seconds between a rank's heartbeats: $FIRESCALE_HEARTBEAT_SECONDS, else DEFAULT_INTERVAL_S (0: none)."""
    text = (os.environ if env is None else env).get(INTERVAL_VARIABLE, "")
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise FirescaleError(f"{INTERVAL_VARIABLE} is {text!r}; it must be a number of seconds >= 0 (0: no heartbeat)")
    return value


class Heartbeat:
    """This rank's heartbeat in `run_dir`; no file and no thread when the interval is 0."""

    def __init__(self, run_dir: str | Path, rank: int, size: int, interval_s: float | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.interval_s = heartbeat_interval() if interval_s is None else float(interval_s)
        self.rank, self.size = rank, size
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.job_id = os.environ.get("FIRESCALE_JOB_ID", "")
        self.phase, self.iteration, self.steps = "startup", 0, 0
        self.phase_time = time.time()
        self.error = self.gave_up = ""
        self.beats = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()    # one writer at a time: the thread, or the last write
        self._failed_write = False

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def start(self) -> Heartbeat:
        if self.enabled and self._thread is None:
            self._write()
            self._thread = threading.Thread(target=self._run, name="firescale-heartbeat", daemon=True)
            self._thread.start()
        return self

    # ------------------------------------------------------------ what the loop calls
    def enter(self, phase: str) -> None:
        """The rank begins `phase` (jobs.heartbeat.PHASES); written at once."""
        if phase not in PHASES:
            raise ValueError(f"unknown heartbeat phase {phase!r}")
        self.phase, self.steps, self.phase_time = phase, 0, time.time()
        self._wake.set()

    @contextlib.contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """In `phase` for the block, then back in the phase before it."""
        before, steps = self.phase, self.steps
        self.enter(phase)
        try:
            yield
        finally:
            self.enter(before)
            self.steps = steps

    def updated(self, iteration: int) -> None:
        """An update is done: `iteration` of them in all (the loop's hot path: two stores)."""
        self.iteration = iteration
        self.steps += 1

    def step(self) -> None:
        """A step of the phase is done (a test batch evaluated)."""
        self.steps += 1

    def fail(self, exc: BaseException) -> None:
        """The rank stops with `exc`: its words, and the collective that gave up when that was why, written last."""
        self.error = str(exc) or type(exc).__name__
        self.gave_up = str(getattr(exc, "collective", "") or "")
        self.stop("failed")

    def stop(self, phase: str = "done") -> None:
        """The last heartbeat, in `phase`; the thread ends."""
        self._stopping = True
        self.phase = phase
        self._wake.set()
        wait = max(5.0, 2 * self.interval_s)
        if self._thread is not None:
            self._thread.join(timeout=wait)
            self._thread = None
        if self.enabled:
            self._write(wait)   # not for ever: a write that hangs on a dead mount must not hold the exit

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if not self._stopping:
                self._write()

    def _write(self, wait: float = -1) -> None:
        if not self._lock.acquire(timeout=wait):
            return
        try:
            self._write_locked()
        finally:
            self._lock.release()

    def _write_locked(self) -> None:
        if not self.run_dir.is_dir():   # not made yet: the trainer makes it once its inputs are checked
            return
        self.beats += 1
        beat = RankBeat(rank=self.rank, size=self.size, host=self.host, pid=self.pid, job_id=self.job_id,
                        phase=self.phase, iteration=self.iteration, steps=self.steps, beat=self.beats,
                        time=time.time(), phase_time=self.phase_time, interval_s=self.interval_s,
                        error=self.error, gave_up=self.gave_up)
        try:
            write_beat(self.run_dir, beat)
        except (OSError, FirescaleError) as exc:   # the run goes on; the runner sees a silent rank
            if not self._failed_write:
                print(f"firescale: rank {self.rank}: cannot write its heartbeat ({exc}); trying again",
                      file=sys.stderr, flush=True)
            self._failed_write = True
