"""A training job's heartbeat: each rank's small file of where it is (phase, iteration), rewritten every few seconds.

The trainer writes `heartbeat/rank-NNNNN.json` in its run folder, one file per rank, from a thread of its own
(train/heartbeat.py): the thread rewrites it every `interval_s` seconds while the process runs, whatever the
training loop does, and the loop only moves the numbers it holds.  So the file says two things apart: that
the rank's process is alive (`beat` grows), and whether it makes progress (`phase`, `iteration` and `steps`
change).  The runner (jobs/stall.py) judges both by its own clock, never by the ranks'.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json

HEARTBEAT_FORMAT = "firescale.heartbeat/1"
HEARTBEAT_DIR = "heartbeat"
# What a rank does, in order.  In train and eval a rank must progress (iterations, test batches); start-up
# (the process group, the net, the warm-up), the dataset's check, a snapshot and the finish (the layer
# trace, the result) must only stay alive.
PHASES = ("startup", "dataset-check", "train", "eval", "snapshot", "finish", "done", "failed")
PROGRESSING = frozenset({"train", "eval"})
ENDED = frozenset({"done", "failed"})
DEFAULT_INTERVAL_S = 2.0
INTERVAL_VARIABLE = "FIRESCALE_HEARTBEAT_SECONDS"   # the job's override of DEFAULT_INTERVAL_S (0: no heartbeat)


@dataclass
class RankBeat:
    """One rank's heartbeat as its file holds it."""

    rank: int
    size: int
    host: str
    pid: int
    job_id: str
    phase: str
    iteration: int        # updates done
    steps: int            # progress within the phase: iterations in train, test batches in eval
    beat: int             # writes so far: grows while the process lives
    time: float           # the rank's clock at this write (seconds since the epoch), for people
    phase_time: float     # the rank's clock when the phase began
    interval_s: float
    error: str = ""       # why the rank failed (phase failed)
    gave_up: str = ""     # the collective that gave up waiting for a peer, when that was why
    format: str = HEARTBEAT_FORMAT

    @property
    def progress(self) -> tuple[str, int, int]:
        """What changes when the rank makes progress."""
        return self.phase, self.iteration, self.steps

    @property
    def where(self) -> str:
        """'rank 1 on n2'."""
        return f"rank {self.rank} on {self.host}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def heartbeat_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR


def beat_path(run_dir: str | Path, rank: int) -> Path:
    return heartbeat_dir(run_dir) / f"rank-{rank:05d}.json"


def write_beat(run_dir: str | Path, beat: RankBeat) -> Path:
    """Write one rank's heartbeat atomically (a reader sees the old file or the new, never half of one)."""
    return atomic_write_json(beat_path(run_dir, beat.rank), beat.to_dict())


def _beat_from(data: Any) -> RankBeat | None:
    if not isinstance(data, dict) or data.get("format") != HEARTBEAT_FORMAT:
        return None
    names = {f.name for f in fields(RankBeat)}
    try:
        return RankBeat(**{k: v for k, v in data.items() if k in names})
    except TypeError:
        return None


def read_beats(run_dir: str | Path) -> dict[int, RankBeat]:
    """Every rank's heartbeat in the run folder, by rank.  A file that is not one (another version's, or
    unreadable for a moment on a shared filesystem) is left out: the runner looks again at its next poll."""
    beats: dict[int, RankBeat] = {}
    folder = heartbeat_dir(run_dir)
    if not folder.is_dir():
        return beats
    for path in sorted(folder.glob("rank-*.json")):
        try:
            beat = _beat_from(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        if beat is not None:
            beats[beat.rank] = beat
    return beats


def clear_beats(run_dir: str | Path) -> None:
    """Remove the heartbeats of an earlier job in the run folder, before the next one starts."""
    for path in heartbeat_dir(run_dir).glob("rank-*.json"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
