"""The fuzz tier's harness: its budgets, the property every reader keeps, and the scratch files examples use.

The property: whatever bytes or text a user's file holds, its reader returns a value or stops with one
FirescaleError of one line naming the file; never another exception, a signal or a hang.  The inputs are
mutations of the real files the repository ships (mutate.py).

Budgets (docs/testing.md#the-fuzz-tier): `make test` runs each target's `examples` (FIRESCALE_FUZZ unset, the
examples drawn the same way every run, no database); `make fuzz` sets FIRESCALE_FUZZ=long, which multiplies them
by FIRESCALE_FUZZ_SCALE, draws them from pytest's --hypothesis-seed and keeps failing examples in
FIRESCALE_FUZZ_DB.  Each example counts in `TRIED` (`trial`), which `make fuzz` adds up per target.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from firescale.errors import FirescaleError

REPO = Path(__file__).resolve().parents[2]
LONG = os.environ.get("FIRESCALE_FUZZ", "") == "long"
SCALE = int(os.environ.get("FIRESCALE_FUZZ_SCALE", "40")) if LONG else 1
# An example that takes this long has hung: a reader's example takes milliseconds.
HANG_S = float(os.environ.get("FIRESCALE_FUZZ_HANG_S", "30"))
# Per target: examples run and seconds spent, this process (FIRESCALE_FUZZ_STATS: written at the session's end).
TRIED: dict[str, list[float]] = {}


def budget(examples: int) -> settings:
    """Hypothesis's settings for a target run `examples` times in `make test` (more under `make fuzz`)."""
    common: dict[str, Any] = {"deadline": None, "max_examples": examples * SCALE, "print_blob": True,
                              "suppress_health_check": list(HealthCheck)}
    if not LONG:
        return settings(derandomize=True, database=None, **common)
    db = os.environ.get("FIRESCALE_FUZZ_DB")
    return settings(database=DirectoryBasedExampleDatabase(db) if db else None, **common)


class Hang(Exception):
    """An example still running after HANG_S seconds."""


@contextmanager
def trial(target: str, seconds: float = HANG_S) -> Iterator[None]:
    """One example of `target`, counted; a Hang raised in it after `seconds` (SIGALRM: Python code is stopped
    between bytecodes, so a reader looping forever fails the example rather than the whole run)."""
    def alarm(signum, frame):
        raise Hang(f"{target}: an example still ran after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.perf_counter()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        tally = TRIED.setdefault(target, [0, 0.0])
        tally[0] += 1
        tally[1] += time.perf_counter() - start


def write_stats() -> None:
    """Add this process's TRIED to the JSON file FIRESCALE_FUZZ_STATS names ({target: [examples, seconds]})."""
    path = os.environ.get("FIRESCALE_FUZZ_STATS")
    if not path or not TRIED:
        return
    stats = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    for target, (n, seconds) in TRIED.items():
        old = stats.get(target, [0, 0.0])
        stats[target] = [old[0] + n, old[1] + seconds]
    Path(path).write_text(json.dumps(stats, indent=1, sort_keys=True))


def one_sentence(exc: FirescaleError, names: str | Path | Sequence[str | Path]) -> None:
    """A user's error: one line, naming the file (one of `names`: a path or its name) it is about."""
    text = str(exc)
    assert text and "\n" not in text.strip(), f"more than one line: {text!r}"
    wanted = [names] if isinstance(names, (str, Path)) else list(names)
    assert any(str(n) in text or Path(n).name in text for n in wanted), \
        f"the sentence names none of {[str(n) for n in wanted]}: {text!r}"


def read_or_refuse(read: Callable[[], Any], names: str | Path | Sequence[str | Path]) -> Any:
    """`read()`'s value, or None when it stopped with one sentence naming the file; anything else fails."""
    try:
        return read()
    except FirescaleError as exc:
        one_sentence(exc, names)
        return None


# ---------------------------------------------------------------- files

_SCRATCH: list[Path] = []


def scratch_file(name: str, content: str | bytes, folder: str = "") -> Path:
    """`content` written as `name` (in `folder`) in this process's scratch folder, over the last example's."""
    import atexit
    import shutil
    import tempfile

    if not _SCRATCH:
        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="firescale-fuzz-")))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    path = _SCRATCH[0] / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogateescape")
    return path


def shipped(*patterns: str) -> list[Path]:
    """The repository's files matching the glob `patterns` (relative to its root), sorted."""
    return sorted({p for pattern in patterns for p in REPO.glob(pattern) if p.is_file()})
