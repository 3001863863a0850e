"""The options of `firescale train`: its one argument parser, the options it resolves to (`TrainOptions`), and
their record form, which a run record keeps (`options` in result.json).

A reader of a run record (the calibration's short run, its net's crop, its probe's framework and process
group) takes the options its run trained with from the record itself; a record written before it kept them
has its command line parsed by this same parser, so nothing reads a recorded command line by hand.  The
parser takes no abbreviated option: `--frame pytorch` in a record would otherwise be read by the trainer as
--framework and missed by anything looking for `--framework`.
"""
from __future__ import annotations

import argparse
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, DEFAULT_PRECISION
from firescale.train.scaling import parse_batch_schedule
from firescale.train.timing import SPLIT_EVERY


@dataclass
class TrainOptions:
    """The `firescale train` command line, resolved."""

    dataset: Path
    net: str | None     # a built-in net's name or a Caffe net file; None: the solver's net: line
    solver: Path
    out: Path
    overrides: list[str] = field(default_factory=list)
    batch_per_rank: int | None = None
    total_batch: int | None = None
    reference_batch: int | None = None
    lr_scaling: str = "none"
    warmup_iters: int = 0
    warmup_start_lr: float | None = None
    target: float | None = None
    target_from: list[Path] | None = None   # the baseline's repeats: the target is their mean
    tolerance: float = 0.01
    resume: bool = False
    snapshot: Path | None = None    # resume from this snapshot (its .solverstate), not the newest in OUT
    weights: Path | None = None     # start from Caffe's weights (.caffemodel or .caffemodel.h5), by layer name
    seed: int | None = None
    eval_batch: int = 256
    profile_layers: bool = False
    data_format: str | None = None
    # The transform; None: not given, so the net file's TRAIN data layer says it, else 1/255 and none (data_layers)
    scale: float | None = None
    mean: tuple[float, ...] | str | None = None
    crop: int | None = None
    mirror: bool | None = None
    threads: int = 1
    layer_plan: Path | None = None   # a file with a `dist` plan (default: the solver file's own, if any)
    batch_schedule: list[tuple[int, int]] = field(default_factory=list)  # (iteration, batch) changes
    split_every: int = SPLIT_EVERY   # time the iteration in parts every this many iterations (1: all of them)
    overlap_allreduce: bool = False  # each gradient's allreduce as backward produces it (the whole iterations)
    read_limit_mbs: float | None = None  # each training read takes at least its stored bytes / this many MB/s
    framework: str = DEFAULT_FRAMEWORK   # the backend that trains (firescale.frameworks.REGISTRY)
    precision: str = DEFAULT_PRECISION   # fp32 (Caffe's numerics), tf32 or bf16
    process_group: str = "auto"          # pytorch: gloo, mpi, nccl, or auto (train.backend.resolve_process_group)
    command: list[str] = field(default_factory=list)   # the command line as given; not in the record form


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
    """`firescale train`'s arguments; each one's dest is the TrainOptions field it fills."""
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
    parser.add_argument("--split-every", type=int, default=SPLIT_EVERY, metavar="N",
                        help="time data wait, compute and allreduce apart on every Nth iteration (and the first), "
                             f"the host waiting after each part; the others run as one graph (default {SPLIT_EVERY}; "
                             "1: all)")
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
    parser.add_argument("--framework", default=DEFAULT_FRAMEWORK, metavar="NAME",
                        help="the backend that trains: tensorflow (Horovod; the default) or pytorch "
                             "(NCCL on GPUs; on CPUs MPI through mpi4py, or Gloo)")
    parser.add_argument("--precision", default=DEFAULT_PRECISION, metavar="NAME",
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


def options_from_args(args: argparse.Namespace, command: Sequence[str] = ()) -> TrainOptions:
    """The parsed arguments as TrainOptions (each argument's dest is its field), `command` the line they came
    from; a bad --batch-schedule is refused here."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainOptions) if f.name not in ("command", "batch_schedule")}
    given["overrides"] = list(given["overrides"])
    return TrainOptions(**given, command=list(command),
                        batch_schedule=parse_batch_schedule(args.batch_schedule) if args.batch_schedule else [])


# ------------------------------------------------------------ the record form
def record_options(opts: TrainOptions) -> dict[str, Any]:
    """The options a run record keeps (`options` in result.json): every field but the command line, JSON's
    types (paths as given, as strings; tuples as lists)."""
    return {f.name: _plain(getattr(opts, f.name)) for f in fields(TrainOptions) if f.name != "command"}


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# How a field is spelled on the command line where its flag is not its name, and the fields that are switches
# (given, or left out), either way (--mirror, --no-mirror), or several values after one flag.
_FLAGS = {"overrides": "--set"}
_SWITCHES = frozenset({"resume", "profile_layers", "overlap_allreduce"})
_EITHER_WAY = frozenset({"mirror"})
_SEVERAL = frozenset({"target_from"})
_RECORD_KEYS = frozenset(f.name for f in fields(TrainOptions)) - {"command"}


def _arguments(options: Mapping[str, Any]) -> list[str]:
    """The arguments after `firescale train` that give `options` (the record form) back, each option that has a
    value, --out last (a caller may drop its value and add its own)."""
    args: list[str] = []
    for key, value in options.items():
        flag = _FLAGS.get(key, "--" + key.replace("_", "-"))
        if key == "out" or value is None:
            continue
        if key in _EITHER_WAY:
            args.append(flag if value else "--no-" + flag[2:])
        elif key in _SWITCHES:
            args += [flag] if value else []
        elif key == "overrides":
            for override in value:
                args += _option(flag, override)
        elif key in _SEVERAL:
            args += [flag, *map(str, value)]
        elif key == "batch_schedule":
            args += _option(flag, ",".join(f"{it}:{batch}" for it, batch in value)) if value else []
        elif key == "mean" and isinstance(value, list):
            args += _option(flag, ",".join(map(str, value)))
        else:
            args += _option(flag, str(value))
    return [*args, *_option("--out", str(options["out"]))]


def _option(flag: str, value: str) -> list[str]:
    """`flag value`, or `flag=value` for a value that would read as an option."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def train_command(opts: TrainOptions, program: Sequence[str] = ("firescale",)) -> list[str]:
    """A `firescale train` command line that trains with `opts` (`program` starts it, e.g. this interpreter's
    `python -m firescale`): every option that has a value spelled out, defaults included, so that the run
    does not change when a default does; --out and its folder last."""
    return [*program, "train", *_arguments(record_options(opts))]


# ------------------------------------------------------------ reading a record's options back
class _Refused(Exception):
    """What the parser said of arguments it does not take."""


class _RecordParser(argparse.ArgumentParser):
    """`firescale train`'s parser for what a record says: a bad line is an error to name it by, not an exit."""

    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def _parse(arguments: Sequence[str], where: str, what: str, command: Sequence[str] = ()) -> TrainOptions:
    parser = _RecordParser(prog="firescale train", allow_abbrev=False, add_help=False)
    add_arguments(parser)
    try:
        return options_from_args(parser.parse_args(list(arguments)), command)
    except _Refused as exc:
        whole = ("; options are read spelled out in full (firescale train takes no abbreviation)"
                 if str(exc).startswith("unrecognized arguments") else "")
        raise FirescaleError(f"{where}: `firescale train` does not take the recorded {what}: {exc}{whole}") from None
    except FirescaleError as exc:
        raise FirescaleError(f"{where}: `firescale train` does not take the recorded {what}: {exc}") from None


def _train_arguments(command: Sequence[str], where: str) -> list[str]:
    args = list(command)
    if not args:
        raise FirescaleError(f"{where}: the run record has no `firescale train` command line")
    if args[:2] != ["firescale", "train"]:
        raise FirescaleError(f"{where}: the recorded command line {shlex.join(args)!r} is not `firescale train`'s")
    return args[2:]


def options_from_command(command: Sequence[str], where: str = "the run record") -> dict[str, Any]:
    """The options (record form) of a recorded `firescale train` command line, as the trainer read it: for
    records from before runs kept their options.  A line the parser does not take now (an abbreviated
    `--batch 64`, an option since removed) is one sentence naming `where`."""
    return record_options(_parse(_train_arguments(command, where), where, "command line", command))


def options_from_record(options: Mapping[str, Any], where: str = "the run record") -> TrainOptions:
    """A record's `options` as TrainOptions, read through the same parser as the command line (each value
    checked as the trainer checks it); an unknown key or a bad value is one sentence naming `where`."""
    if not isinstance(options, Mapping):
        raise FirescaleError(f"{where}: options is {type(options).__name__}, not an object of option names")
    unknown = sorted(set(options) - _RECORD_KEYS)
    if unknown:
        raise FirescaleError(f"{where}: options has unknown key {unknown[0]!r}")
    if not isinstance(options.get("out"), str):
        raise FirescaleError(f"{where}: options has no run folder (`out`)")
    return _parse(_arguments(options), where, "options")


def recorded_options(options: Mapping[str, Any], command: Sequence[str], where: str) -> TrainOptions | None:
    """The options a run trained with, from its record (`where`): its `options`, else its command line (a
    record from before they were kept); None when it has neither."""
    if options:
        found = options_from_record(options, where)
        found.command = list(command)
        return found
    if command:
        return _parse(_train_arguments(command, where), where, "command line", command)
    return None
