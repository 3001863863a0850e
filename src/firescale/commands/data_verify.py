"""`firescale data verify`: re-hash a dataset's files and decode every record against its manifest."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", type=Path, help="dataset folder (holding manifest.json)")


def run(args: argparse.Namespace) -> int:
    from firescale.data.manifest import verify_dataset

    result = verify_dataset(args.dataset)
    records = ", ".join(f"{split} {n}" for split, n in result.records.items())
    print(f"{result.directory}: OK; {records} records decoded and matched; {len(result.files)} files hashed")
    return 0
