"""`firescale data ingest`: write a source as train/test LMDB and HDF5 with a manifest."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", required=True, metavar="digits|idx:DIR|folder:DIR",
                        help="scikit-learn's digits, a directory of MNIST-style IDX files, or an image folder "
                             "with one subfolder per class")
    parser.add_argument("--name", help="dataset folder name (default: digits, the IDX or image folder's name)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="directory that receives the dataset folder")
    where.add_argument("--site", help="site profile whose shared dataset path receives the dataset folder")
    parser.add_argument("--formats", default="lmdb,hdf5", help="comma-separated: lmdb, hdf5 (default both)")
    parser.add_argument("--test-fraction", type=float, default=0.2,
                        help="share of each class held out for test (digits, folder; IDX keeps its own split)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    parser.add_argument("--resize", metavar="HxW", help="resize every image (bilinear) to H x W pixels")


def run(args: argparse.Namespace) -> int:
    from firescale.data.ingest import ingest, parse_formats
    from firescale.data.sources import load_source, parse_resize

    formats = parse_formats(args.formats)
    resize = parse_resize(args.resize)
    if args.site:
        from firescale.cluster.site import load_site

        out = load_site(args.site).paths.datasets
    else:
        out = args.out
    kind, _, where = args.source.partition(":")
    name = args.name or (kind if not where else Path(where).resolve().name)
    source = load_source(args.source, test_fraction=args.test_fraction, seed=args.seed, resize=resize)
    options = {"test_fraction": args.test_fraction if kind != "idx" else None, "seed": args.seed,
               "resize": list(resize) if resize else None}
    result = ingest(source, out, name, formats, options=options,
                    command=shlex.join(["firescale", *sys.argv[1:]]) if sys.argv else "")
    splits = ", ".join(f"{s} {i['records']}" for s, i in result.manifest["splits"].items())
    state = "written" if result.written else "up to date (same request digest), left alone"
    print(f"{result.path}: {state}; {splits} records of {tuple(result.manifest['shape'])}, "
          f"formats {', '.join(result.manifest['formats'])}")
    return 0
