"""`firescale bench io`: records/s and MB/s of each reader vs a raw read, and the data wait per step."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, type=Path, help="dataset folder written by data ingest")
    parser.add_argument("--batch", type=int, default=256, help="records per batch (default 256)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement (default 3)")
    parser.add_argument("--split", default="train", help="split to read (default train)")
    parser.add_argument("--formats", help="comma-separated subset of the dataset's formats (default all)")
    parser.add_argument("--no-wait", action="store_true", help="skip the data-wait measurement (no TensorFlow)")
    parser.add_argument("--json", type=Path, help="also write the result to this file")


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from firescale.atomic import atomic_write_json
    from firescale.bench.io import bench_io
    from firescale.errors import FirescaleError

    if args.batch < 1 or args.seconds <= 0:
        raise FirescaleError("--batch must be >= 1 and --seconds > 0")
    formats = [f.strip() for f in args.formats.split(",")] if args.formats else None
    from firescale.caffe.pixels import PIXELS_KERNEL

    kernel = "compiled kernel (c)" if PIXELS_KERNEL == "c" else "numpy fallback"
    print(f"firescale bench io: pixel interleave by the {kernel}", file=sys.stderr)
    result = bench_io(args.dataset, batch=args.batch, seconds=args.seconds, split=args.split, formats=formats,
                      measure_wait=not args.no_wait)
    if args.json:
        atomic_write_json(args.json, result)
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0
