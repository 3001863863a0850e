"""`firescale bench store`: runs/s of adding, selecting and comparing in a results store, beside plain files."""
from __future__ import annotations

import argparse
from pathlib import Path

from firescale.commands.results_add import STORE_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="run_dir", required=True, type=Path,
                        help="a sweep's runs/ folder whose records are copied (results/<site>/<experiment>)")
    parser.add_argument("--runs", type=int, default=10000, help="runs to add (default 10,000)")
    parser.add_argument("--compare", type=int, default=1000, help="runs on each side of the comparison (1,000)")
    parser.add_argument("--batch", type=int, default=10, help="runs per add, as a sweep's report adds (10)")
    parser.add_argument("--store", help=STORE_HELP + "; default: a new SQLite file, removed afterwards")


def run(args: argparse.Namespace) -> int:
    from firescale.errors import FirescaleError
    from firescale.store.benchmark import bench_store

    if min(args.runs, args.compare, args.batch) < 1:
        raise FirescaleError("--runs, --compare and --batch must be at least 1")
    timings = bench_store(args.run_dir, args.store, args.runs, args.compare, args.batch)
    print(f"{'what':<52} {'runs':>7} {'seconds':>9} {'runs/s':>9}")
    for t in timings:
        print(f"{t.what:<52} {t.runs:>7} {t.seconds:>9.3f} {t.per_s:>9.0f}")
    return 0
