"""`firescale bench gpu`: the GPU check (tests, the default experiment, trainer against bare loop, step timings)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from firescale.bench.gpu_check import DEFAULT_FASHION

    parser.add_argument("--out", type=Path, required=True,
                        help="folder that receives summary.md, gpu-check.json and each part's log (six files)")
    parser.add_argument("--minutes", type=float, default=6.0, help="the whole check's budget (default 6)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny nets, data and budgets, on a CPU too: tests the check, measures nothing")
    parser.add_argument("--fashion", type=Path, default=DEFAULT_FASHION,
                        help=f"Fashion-MNIST's IDX files, for the default experiment (default {DEFAULT_FASHION}; "
                             "digits when absent)")
    parser.add_argument("--commit", help="the commit measured, where the checkout has no git (default: git's)")
    parser.add_argument("--checkout", type=Path,
                        help="the firescale checkout whose GPU tests, solvers and sites the parts use (default "
                             "$FIRESCALE_CHECKOUT, else the working folder)")
    parser.add_argument("--work", type=Path, help="keep datasets and runs here (default: a temporary folder)")
    parser.epilog = "What each part runs, and how to run it on a lent GPU: docs/gpu-check.md."


def run(args: argparse.Namespace) -> int:
    from firescale.bench.gpu_check import CheckOptions, check_passed, run_gpu_check
    from firescale.errors import FirescaleError

    if not args.minutes > 0:
        raise FirescaleError(f"--minutes must be above 0, not {args.minutes}")
    opts = CheckOptions(args.out, args.minutes, args.smoke, args.fashion, args.commit, args.work,
                        command=shlex.join(["firescale", *sys.argv[1:]]), checkout=args.checkout)
    record = run_gpu_check(opts, say=lambda s: print(s, flush=True))
    print(f"written: {', '.join(str(args.out / f) for f in record['files'].values())}")
    return 0 if check_passed(record) else 1
