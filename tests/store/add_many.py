"""A writer for the concurrency tests: waits for a start file, then adds COUNT new runs in batches."""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from store_records import noisy_sweep

from firescale.store.add import add_runs
from firescale.store.database import open_store
from firescale.store.runs import RunContext, stored_run


def main(url: str, seed: int, count: int, batch: int, start: str) -> None:
    rng = random.Random(seed)
    records = []
    while len(records) < count:       # sweeps of 3 points x 3 repeats, each a sweep of its own
        records += noisy_sweep(rng, 3)
    runs = [stored_run(raw, RunContext(commit=f"writer{seed}"), where=raw["point"]) for raw in records[:count]]
    store = open_store(url)
    deadline = time.monotonic() + 60
    while not Path(start).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    added = 0
    for i in range(0, len(runs), batch):
        added += add_runs(store, runs[i:i + batch]).added
    store.close()
    print(added)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
