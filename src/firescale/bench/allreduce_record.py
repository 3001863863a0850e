"""One timed allreduce, as `bench allreduce --json` records it and a calibration reads it back."""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from firescale.errors import FirescaleError

# What each entry of the record's `measurements` must hold; the rest has defaults (older and hand-written records).
REQUIRED = ("algorithm", "ranks", "bytes", "median_s")


@dataclass(frozen=True)
class AllreduceMeasurement:
    """Seconds for one allreduce of `bytes` over `ranks` ranks: the slowest rank, per repetition.

    With a step before each allreduce (`compute_s` > 0, the median of the ranks' mean step time) each repetition
    computes first and then reduces, as a training iteration does; `seconds` are then what communication costs
    an iteration, the allreduce and waiting for the slowest rank's step (bench/mpi_algorithms.py for the MPI
    algorithms, bench/allreduce_tensorflow.py and bench/iteration_blocks.py for Horovod's).

    `median_s`, `min_s`, `mean_s` and `hidden_share` follow from the repetitions; a record read back without them
    (written by hand, or before the repetitions were kept) keeps the figures it states, its mean and fastest
    repetition taken as its median where it states none.
    """

    algorithm: str
    ranks: int
    bytes: int
    seconds: list[float] = field(default_factory=list)
    compute_s: float = 0.0
    tensors: int = 0          # a framework's grouped allreduce of this many tensors (+ the loss pair); 0: one
    graph_call_s: float = 0.0  # a framework's allreduce called in a graph: the same call and wait without it
    # after a step, timed too with the allreduce beside a window of compute (the backward pass an overlapped
    # allreduce can hide behind): what it then added, per repetition, and the window's median
    overlapped_seconds: list[float] = field(default_factory=list)
    window_s: float = 0.0
    process_group: str = ""    # a framework's process group that summed (gloo, mpi, nccl; none with one rank)
    median_s: float = math.nan
    min_s: float = math.nan
    mean_s: float = math.nan
    hidden_share: float | None = None

    def __post_init__(self) -> None:
        given = {"median_s": self.median_s, "min_s": self.min_s, "mean_s": self.mean_s}
        if self.seconds:
            derived = {"median_s": statistics.median(self.seconds), "min_s": min(self.seconds),
                       "mean_s": statistics.fmean(self.seconds)}
        elif math.isnan(self.median_s):
            raise FirescaleError(f"a {self.algorithm} allreduce measurement needs its repetitions' seconds or "
                                 "their median_s")
        else:
            derived = {"min_s": self.median_s, "mean_s": self.median_s}
        for name, value in derived.items():
            if math.isnan(given.get(name, math.nan)):
                object.__setattr__(self, name, value)
        if self.hidden_share is None:
            object.__setattr__(self, "hidden_share", self._hidden_share())

    def _hidden_share(self) -> float | None:
        """The share of the allreduce that ran beside the rank's compute when its requests were made as the
        window's compute started: its mean cost after the step less its mean cost beside the window, over
        the first, kept in [0, 1].  0: the rank's core does all of the allreduce's work, as an unshaped veth's
        or shared memory's copies; 1: it runs wholly beside the compute, on a link or device of its own.  The
        window is the backward pass the trainer can hide the allreduce behind, so the share is what the
        overlapped schedule may hide (Platform.comm_hidden_share).  None when not timed."""
        if not self.overlapped_seconds or self.window_s <= 0:
            return None
        serial = self.mean_s
        if serial <= 0:
            return 0.0
        return min(1.0, max(0.0, (serial - statistics.fmean(self.overlapped_seconds)) / serial))

    def to_dict(self) -> dict[str, Any]:
        shown = asdict(self)
        if not self.overlapped_seconds:     # not timed beside compute
            del shown["overlapped_seconds"], shown["window_s"], shown["hidden_share"]
        if not self.process_group:
            del shown["process_group"]
        return shown

    @classmethod
    def from_dict(cls, entry: object, where: str) -> AllreduceMeasurement:
        """An entry of a record's `measurements`, as to_dict wrote it (its predictions beside it ignored); one
        sentence naming `where` (the file and the entry) for one that lacks a key or holds a number of the
        wrong kind."""
        missing = [key for key in REQUIRED if not isinstance(entry, Mapping) or key not in entry]
        if missing or not isinstance(entry, Mapping):
            raise FirescaleError(f"{where} has no {', '.join(repr(m) for m in missing)}; each measurement needs "
                                 f"{', '.join(REQUIRED[:-1])} and {REQUIRED[-1]}")
        known = {f.name for f in fields(cls)}     # the predictions beside it, and any other key, are not read
        return cls(**{key: _checked(key, value, where) for key, value in entry.items()
                      if key in known and value is not None})


_TEXT = ("algorithm", "process_group")
_WHOLE = ("ranks", "bytes", "tensors")
_LISTS = ("seconds", "overlapped_seconds")


def _checked(key: str, value: Any, where: str) -> Any:
    """`value` of `key` as the record's field holds it, or one sentence naming `where`."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if key in _TEXT:
        ok = isinstance(value, str)
    elif key in _LISTS:
        ok = isinstance(value, list) and all(number(v) for v in value)
        value = [float(v) for v in value] if ok else value
    elif key in _WHOLE:
        ok = number(value) and float(value).is_integer()
        value = int(value) if ok else value
    else:
        ok = number(value)
        value = float(value) if ok else value
    if not ok:
        kind = ("text" if key in _TEXT else "a list of seconds" if key in _LISTS
                else "a whole number" if key in _WHOLE else "a number")
        raise FirescaleError(f"{where}: {key} must be {kind}, not {value!r}")
    return value
