"""`firescale bench damage`: damaged copies of a dataset read in children; counts of read, stopped, crashed."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, type=Path,
                        help="a small dataset folder written by data ingest with both formats (e.g. digits)")
    parser.add_argument("--copies", type=int, default=500, help="damaged copies to read (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the damages (default 0)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a child may read before it counts as hung (default 60)")
    parser.add_argument("--work", type=Path, help="folder for the copies (default: a temporary one, removed)")


def run(args: argparse.Namespace) -> int:
    from firescale.bench.damage import sweep
    from firescale.data.manifest import load_manifest
    from firescale.errors import FirescaleError

    if args.copies < 1 or args.timeout <= 0:
        raise FirescaleError("--copies must be at least 1 and --timeout more than 0")
    formats = load_manifest(args.dataset)["formats"]
    if sorted(formats) != ["hdf5", "lmdb"]:
        raise FirescaleError(f"{args.dataset} has formats {formats}; the sweep damages both lmdb and hdf5")
    with tempfile.TemporaryDirectory(dir=args.work, prefix="damage-") as work:
        result = sweep(args.dataset, Path(work), args.copies, seed=args.seed, timeout=args.timeout)
    for trial in result.failures:
        d = trial.damage
        print(f"{trial.outcome}: {d.target} {d.file} {d.kind} ({d.detail}): {trial.message}")
    counts = result.counts
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    print(f"{len(result.trials)} damaged copies (seed {args.seed}): {summary}")
    by_target: dict[str, dict[str, int]] = {}
    for trial in result.trials:
        row = by_target.setdefault(trial.damage.target, dict.fromkeys(counts, 0))
        row[trial.outcome] += 1
    for target, row in by_target.items():
        print(f"  {target:<11} " + ", ".join(f"{n} {k}" for k, n in row.items()))
    return 1 if result.failures else 0
