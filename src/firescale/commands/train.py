"""`firescale train`: one rank of a data-parallel training run, TensorFlow + Horovod or PyTorch (launch N)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from firescale.errors import FirescaleError


def _mean(text: str) -> tuple[float, ...] | str:
    """--mean: comma-separated per-channel values, or a .npy/.binaryproto file."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        return text


def _mb_per_s(text: str) -> float:
    """--read-limit-mbs: a finite number of MB per second above zero."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected MB per second, a number above 0, not {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, type=Path,
                        help="dataset folder (manifest.json + train/test LMDB or HDF5), e.g. DATA/digits")
    parser.add_argument("--net", help="a built-in net (lenet, lenet_same, nin, alexnet, googlenet, cifar10_quick, ...) "
                                      "or a Caffe net file (path/to/train_val.prototxt); default: the solver's net: "
                                      "line, relative to the solver file")
    parser.add_argument("--solver", required=True, type=Path,
                        help="solver in Caffe keys: SOLVER.yaml or solver.prototxt")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a solver key (repeatable), e.g. --set base_lr=0.02")
    parser.add_argument("--out", required=True, type=Path, help="run directory: result.json, mllog.txt, snapshots/")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch-per-rank", type=int, help="images per rank per iteration (default: a net file's "
                                                          "TRAIN data layer batch_size, as Caffe's per GPU, else 64)")
    batch.add_argument("--total-batch", type=int, help="images per iteration over all ranks (split evenly)")
    parser.add_argument("--reference-batch", type=int,
                        help="the batch base_lr was tuned for (default: the per-rank batch with --batch-per-rank, "
                             "the total with --total-batch)")
    parser.add_argument("--lr-scaling", choices=("none", "linear", "sqrt"), default="none",
                        help="scale base_lr with effective batch / reference batch (FireCaffe: linear)")
    parser.add_argument("--warmup-iters", type=int, default=0, help="linear learning-rate warm-up over K updates")
    parser.add_argument("--warmup-start-lr", type=float,
                        help="the rate warm-up starts from (Goyal et al.: the baseline's unscaled rate; default: "
                             "base_lr before --lr-scaling, or base_lr / K without scaling)")
    parser.add_argument("--batch-schedule", default="", metavar="ITER:BATCH,...",
                        help="change the batch at these iterations (same unit as --batch-per-rank/--total-batch), "
                             "the learning rate following --lr-scaling; e.g. 10000:16 (Oh and Lee's 16+)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target", type=float, help="stop at the first evaluation with top-1 >= this")
    target.add_argument("--target-from", type=Path, nargs="+", metavar="BASELINE_RESULT.json",
                        help="target = the baseline run's final top-1 (the mean over several) minus --tolerance")
    parser.add_argument("--tolerance", type=float, default=0.01, help="with --target-from (default 0.01)")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", help="continue from the newest snapshot in OUT/snapshots")
    resume.add_argument("--snapshot", type=Path, metavar="FILE.solverstate",
                        help="continue from this snapshot (its .solverstate or .solverstate.h5), as Caffe's "
                             "--snapshot")
    parser.add_argument("--weights", type=Path, metavar="FILE.caffemodel",
                        help="start from Caffe's weights (.caffemodel or .caffemodel.h5), copied by layer name; "
                             "the net's layers the file lacks keep their fillers (with --resume: only when "
                             "there is no snapshot yet)")
    parser.add_argument("--seed", type=int, help="seed for weights, data order and dropout (default: the "
                                                 "solver's random_seed, else 1)")
    parser.add_argument("--eval-batch", type=int, default=256, help="test images per evaluation step, all ranks")
    parser.add_argument("--profile-layers", action="store_true",
                        help="also time every layer's forward and backward pass into OUT/layers.json")
    parser.add_argument("--split-every", type=int, default=50, metavar="N",
                        help="time data wait, compute and allreduce apart on every Nth iteration (and the first), "
                             "the host waiting after each part; the others run as one graph (default 50; 1: all)")
    parser.add_argument("--overlap-allreduce", action="store_true",
                        help="start each gradient's allreduce as soon as backward produces it (wait-free "
                             "backprop, as Horovod's DistributedGradientTape) instead of one grouped allreduce "
                             "after the whole backward pass; the iterations timed in parts stay grouped")
    parser.add_argument("--data-format", choices=("lmdb", "hdf5"), help="which copy of the dataset to read")
    parser.add_argument("--read-limit-mbs", type=_mb_per_s, metavar="MB_PER_S",
                        help="emulate slower storage: each training read of this rank takes at least its stored "
                             "record bytes / MB_PER_S (the rank sleeps for the rest after the read; the weights "
                             "do not change); recorded in result.json as read_limit_mbs")
    parser.add_argument("--scale", type=float, help="pixel scale after mean subtraction (default: a net file's "
                                                    "TRAIN data layer transform_param, as Caffe's, else 1/255)")
    parser.add_argument("--mean", type=_mean, help="per-channel mean values (comma-separated) or a mean file "
                                                   "(default: a net file's transform_param, else none)")
    parser.add_argument("--crop", type=int, help="crop size, random in training, centre in test (default: a net "
                                                 "file's transform_param crop_size, else none)")
    parser.add_argument("--mirror", action=argparse.BooleanOptionalAction,
                        help="random horizontal flips in training (default: a net file's transform_param, else no)")
    parser.add_argument("--framework", default="tensorflow", metavar="NAME",
                        help="the backend that trains: tensorflow (Horovod; the default) or pytorch "
                             "(NCCL on GPUs; on CPUs MPI through mpi4py, or Gloo)")
    parser.add_argument("--precision", default="fp32", metavar="NAME",
                        help="fp32 (Caffe's numerics, TF32 off; the default), tf32 (TF32 matrix products on GPUs "
                             "that have them) or bf16 (pytorch: autocast to bfloat16, float32 weights)")
    parser.add_argument("--process-group", default="auto", metavar="NAME",
                        help="pytorch: the process group that sums the gradients: nccl (GPUs), mpi (CPUs: "
                             "MPI_Allreduce through mpi4py on the tensors' own memory, for ranks an MPI launcher "
                             "started), gloo (CPUs: torch.distributed's Gloo) or auto (the default: NCCL on GPU "
                             "nodes; on CPU nodes mpi where mpirun, aprun or srun --mpi started the ranks and "
                             "mpi4py imports, else gloo)")
    parser.add_argument("--threads", type=int, default=1, help="the framework's threads per rank (default 1)")
    parser.add_argument("--layer-plan", type=Path, metavar="FILE",
                        help="split each replica's layers over devices by the dist blocks in FILE (a solver "
                             ".prototxt or .yaml); default: the solver file's own dist blocks, if any")


def run(args: argparse.Namespace) -> int:
    from firescale.frameworks import check_framework, check_precision
    from firescale.train.scaling import parse_batch_schedule
    from firescale.train.trainer import TrainOptions, run_training

    if args.snapshot is not None and args.weights is not None:
        raise FirescaleError("give --snapshot to resume training or --weights to fine-tune, not both (as Caffe says)")
    check_framework(args.framework)
    check_precision(args.precision)
    if args.threads < 1:
        raise FirescaleError(f"--threads must be at least 1, not {args.threads}")
    opts = TrainOptions(
        dataset=args.dataset, net=args.net, solver=args.solver, out=args.out, overrides=list(args.overrides),
        batch_per_rank=args.batch_per_rank, total_batch=args.total_batch, reference_batch=args.reference_batch,
        lr_scaling=args.lr_scaling, warmup_iters=args.warmup_iters, warmup_start_lr=args.warmup_start_lr,
        target=args.target, target_from=args.target_from, tolerance=args.tolerance, resume=args.resume, seed=args.seed,
        snapshot=args.snapshot, weights=args.weights,
        eval_batch=args.eval_batch, profile_layers=args.profile_layers, data_format=args.data_format,
        scale=args.scale, mean=args.mean, crop=args.crop, mirror=args.mirror, threads=args.threads,
        split_every=args.split_every, layer_plan=args.layer_plan, overlap_allreduce=args.overlap_allreduce,
        read_limit_mbs=args.read_limit_mbs, framework=args.framework, precision=args.precision,
        process_group=args.process_group,
        batch_schedule=parse_batch_schedule(args.batch_schedule) if args.batch_schedule else [],
        command=["firescale", "train", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "train" else [],
    )
    return run_training(opts)
