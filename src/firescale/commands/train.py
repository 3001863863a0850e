"""`firescale train`: one rank of a data-parallel training run, TensorFlow + Horovod or PyTorch (launch N)."""
from __future__ import annotations

import argparse
import sys

from firescale.errors import FirescaleError
from firescale.train.options import add_arguments, options_from_args

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    from firescale.frameworks import check_framework, check_precision
    from firescale.train.trainer import run_training

    if args.snapshot is not None and args.weights is not None:
        raise FirescaleError("give --snapshot to resume training or --weights to fine-tune, not both (as Caffe says)")
    check_framework(args.framework)
    check_precision(args.precision)
    if args.threads < 1:
        raise FirescaleError(f"--threads must be at least 1, not {args.threads}")
    command = ["firescale", "train", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "train" else []
    return run_training(options_from_args(args, command))
