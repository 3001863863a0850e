"""`bench store`: adding, selecting and comparing many runs, beside reading the same records from files.

The runs are copies of a real sweep's records, each made new (its seed and its times changed a little),
so that every one is a run of its own to the store.  The yardstick is what a user does without a store:
reading the same records from their JSON files, as merging reports by hand starts.
"""
from __future__ import annotations

import copy
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firescale.store.add import add_runs, read_raw_record, run_files
from firescale.store.compare import compare_selections
from firescale.store.database import open_store
from firescale.store.runs import RunContext, StoredRun, stored_run
from firescale.store.select import Selection, select_runs


@dataclass(frozen=True)
class Timing:
    what: str
    runs: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else float("inf")


def copies(templates: list[dict[str, Any]], count: int, seed: int, slower: float = 1.0) -> list[dict[str, Any]]:
    """`count` new records from `templates`: each a template with a new seed and its times scaled by about
    `slower` (2% noise)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        raw = copy.deepcopy(templates[i % len(templates)])
        train = raw.get("train")
        if train is not None:
            train["seed"] = rng.randrange(1 << 40)
            factor = slower * rng.gauss(1.0, 0.02)
            split = train["per_iteration"]
            for key in ("data_wait_s", "compute_s", "allreduce_s"):
                split[key] *= factor
            train["train_time_s"] *= factor
        else:
            raw["reason"] = f"{raw.get('reason', '')} (copy {seed}.{i})"
        out.append(raw)
    return out


def _timed(what: str, runs: int, work: Any) -> tuple[Timing, Any]:
    start = time.perf_counter()
    value = work()
    return Timing(what, runs, time.perf_counter() - start), value


def bench_store(run_dir: Path, url: str | None, runs: int, compared: int, batch: int) -> list[Timing]:
    """Time adding `runs` runs in adds of `batch`, adding them again, selecting them, comparing two sets of
    `compared`, and reading the same records from JSON files; a fresh SQLite store unless `url`."""
    templates = [read_raw_record(p) for p in run_files(run_dir)]
    context = RunContext(commit="bench")
    timings = []
    with tempfile.TemporaryDirectory(prefix="firescale-bench-store-") as tmp:
        store = open_store(url or f"sqlite:///{Path(tmp) / 'bench.sqlite'}")
        records = copies(templates, runs, seed=1)
        stored = [stored_run(raw, context, where="bench") for raw in records]
        adds = [stored[i:i + batch] for i in range(0, len(stored), batch)]
        timing, _ = _timed(f"add {runs} runs, {batch} an add", runs, lambda: [add_runs(store, a) for a in adds])
        timings.append(timing)
        timing, _ = _timed(f"add the same {runs} again (nothing new)", runs,
                           lambda: [add_runs(store, a) for a in adds])
        timings.append(timing)
        if url is None:    # a store rebuilt from its run folders: one add of them all
            whole = open_store(f"sqlite:///{Path(tmp) / 'whole.sqlite'}")
            timing, _ = _timed(f"add {runs} runs in one add", runs, lambda: add_runs(whole, stored))
            timings.append(timing)
            whole.close()
        timing, found = _timed(f"select all {runs}", runs, lambda: select_runs(store, Selection()))
        timings.append(timing)
        timings.append(_time_files(records, Path(tmp)))
        a = [stored_run(raw, context, where="a") for raw in copies(templates, compared, seed=2)]
        b = [stored_run(raw, context, where="b") for raw in copies(templates, compared, seed=3, slower=1.2)]
        add_runs(store, a, tag="bench-a")
        add_runs(store, b, tag="bench-b")
        timing, _ = _timed(f"compare {compared} against {compared}", 2 * compared, lambda: _compare(store))
        timings.append(timing)
        store.close()
    return timings


def _compare(store: Any) -> None:
    a: list[StoredRun] = select_runs(store, Selection.parse("tag=bench-a"))
    b: list[StoredRun] = select_runs(store, Selection.parse("tag=bench-b"))
    compare_selections(a, b)


def _time_files(records: list[dict[str, Any]], tmp: Path) -> Timing:
    """The yardstick: the same records read back from one JSON file each."""
    folder = tmp / "records"
    folder.mkdir()
    for i, raw in enumerate(records):
        (folder / f"{i}.json").write_text(json.dumps(raw))
    start = time.perf_counter()
    for i in range(len(records)):
        json.loads((folder / f"{i}.json").read_text())
    return Timing(f"read the same {len(records)} records from JSON files", len(records),
                  time.perf_counter() - start)
