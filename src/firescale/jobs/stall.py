"""Stalls: a running job whose ranks stopped beating or stopped making progress for longer than `stall_after`.

The runner reads the ranks' heartbeats (jobs/heartbeat.py) at every poll and notes, by its own clock, when
each rank's file last changed (`beat`: the process is alive) and when its progress last changed (phase,
iteration, test batches).  The job is stalled when no rank progressed for longer than `stall_after` seconds,
and

- a rank's heartbeat did not change at all for that long (its process is stopped, hung in the kernel, or
  gone), in any phase but the end; or
- every rank that has not ended is in a phase that must progress (train, eval).

Start-up, the dataset's check, a snapshot and the finish are not judged by progress, only by the beat: they take as
long as they take.  A job that writes no heartbeat (not yet started, or not a training job) is never
stalled.  A slow job that progresses is never stalled: the judge asks whether anything moved, not how fast.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firescale.data.batch import READ_MAX
from firescale.jobs.heartbeat import ENDED, PROGRESSING, RankBeat, read_beats

# The default stall_after is at least this many predicted iterations ...
STALL_ITERATIONS = 100
# ... and this many reads' worth of them: the trainer reads a point's small batches several at once (its
# prediction's batches_per_read, at most data.batch.READ_MAX), so a job ten times slower than predicted
# updates in bursts ten reads' worth of predicted iterations apart ...
STALL_READS = 12
STALL_EVALUATIONS = 2     # ... and this many predicted evaluations,
STALL_FLOOR_S = 120.0     # and never less than the site's limits.stall_after_floor (this by default)
BEATS_PER_STALL = 3       # stall_after is at least this many heartbeat intervals


def default_stall_after(prediction: Mapping[str, Any] | None, floor_s: float = STALL_FLOOR_S) -> float:
    """A point's stall_after from its prediction (predict.json's entry for the point): the largest of
    STALL_ITERATIONS predicted iterations, STALL_READS reads of its batches (an older prediction, which does
    not say how many batches a read takes, is taken to read READ_MAX) and STALL_EVALUATIONS predicted
    evaluations, never below `floor_s`.  Without a prediction, `floor_s`."""
    if not prediction:
        return float(floor_s)
    iteration = float(prediction.get("iteration_s") or 0.0)
    per_read = int(prediction.get("batches_per_read") or READ_MAX)
    evaluations = int(prediction.get("evaluations") or 0)
    one_eval = float(prediction.get("evaluation_s") or 0.0) / evaluations if evaluations else 0.0
    candidates = [floor_s, max(STALL_ITERATIONS, STALL_READS * per_read) * iteration, STALL_EVALUATIONS * one_eval]
    return float(max(c for c in candidates if math.isfinite(c)))


@dataclass
class _Seen:
    """What the runner last saw of one rank, and when (its own clock)."""

    beat: RankBeat
    beat_at: float
    progress_at: float


@dataclass
class Stall:
    """A stalled job: how long nothing moved, the last iteration, the ranks that stopped and those left waiting."""

    after_s: float
    idle_s: float
    last_iteration: int
    stopped: list[dict[str, Any]]
    waiting: list[dict[str, Any]]

    def words(self) -> str:
        stopped = "; ".join(_rank_words(r, "stopped beating") for r in self.stopped)
        waiting = ", ".join(f"{r['where']} ({r['phase']}, iteration {r['iteration']})" for r in self.waiting)
        if self.stopped:
            what = stopped + (f"; alive but waiting: {waiting}" if waiting else "")
        else:
            what = f"every rank alive, none progressing (a collective or a device hangs): {waiting}"
        return (f"no progress for {self.idle_s:.0f} s (stall_after {self.after_s:g} s), last iteration "
                f"{self.last_iteration}: {what}")

    def to_dict(self) -> dict[str, Any]:
        return {"stall_after_s": self.after_s, "idle_s": round(self.idle_s, 1), "last_iteration": self.last_iteration,
                "stopped": self.stopped, "waiting": self.waiting}


def _rank_words(r: dict[str, Any], what: str) -> str:
    return f"{r['where']} {what} {r['silent_s']:.0f} s ago ({r['phase']}, iteration {r['iteration']})"


@dataclass
class StallWatch:
    """Watches one job's heartbeats in `run_dir`; `check()` at every poll says whether it stalled."""

    run_dir: Path
    stall_after: float
    clock: Callable[[], float] = time.monotonic
    seen: dict[int, _Seen] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget the last job's ranks (before the next submission)."""
        self.seen.clear()

    def beats(self) -> dict[int, RankBeat]:
        """The ranks' heartbeats as last seen."""
        return {rank: s.beat for rank, s in self.seen.items()}

    def effective_after(self) -> float:
        """stall_after, but at least BEATS_PER_STALL of the slowest rank's heartbeat intervals."""
        intervals = [s.beat.interval_s for s in self.seen.values()]
        return max([self.stall_after, *(BEATS_PER_STALL * i for i in intervals)])

    def look(self) -> float:
        """Read the heartbeats and note what changed; the time of this look."""
        now = self.clock()
        for rank, beat in read_beats(self.run_dir).items():
            old = self.seen.get(rank)
            if old is None:
                self.seen[rank] = _Seen(beat, now, now)
                continue
            if beat.beat != old.beat.beat or beat.progress != old.beat.progress:
                old.beat_at = now
            if beat.progress != old.beat.progress:
                old.progress_at = now
            old.beat = beat
        return now

    def check(self) -> Stall | None:
        """The stall, when the job's ranks show one (module docstring), else None."""
        now = self.look()
        live = {rank: s for rank, s in self.seen.items() if s.beat.phase not in ENDED}
        if not live:
            return None
        after = self.effective_after()
        silent = {rank for rank, s in live.items() if now - s.beat_at > after}
        idle = now - max(s.progress_at for s in live.values())
        all_progressing = all(s.beat.phase in PROGRESSING for s in live.values())
        if idle <= after or not (silent or all_progressing):
            return None
        described = {rank: self._describe(s, now) for rank, s in sorted(live.items())}
        return Stall(after_s=after, idle_s=idle, last_iteration=max(s.beat.iteration for s in live.values()),
                     stopped=[d for rank, d in described.items() if rank in silent],
                     waiting=[d for rank, d in described.items() if rank not in silent])

    def gave_up(self) -> list[RankBeat]:
        """The ranks whose collective gave up waiting for a peer (their last heartbeat says which)."""
        self.look()
        return [s.beat for _, s in sorted(self.seen.items()) if s.beat.gave_up]

    @staticmethod
    def _describe(s: _Seen, now: float) -> dict[str, Any]:
        b = s.beat
        return {"rank": b.rank, "host": b.host, "pid": b.pid, "where": b.where, "phase": b.phase,
                "iteration": b.iteration, "silent_s": round(now - s.beat_at, 1)}
