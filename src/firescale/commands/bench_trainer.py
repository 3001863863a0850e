"""`firescale bench trainer`: images/s of `firescale train` beside a bare loop of its framework, for 1 and 2 ranks."""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from firescale.atomic import atomic_write_json
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from firescale.commands.args import add_training_run_arguments

    add_training_run_arguments(parser, "site whose launcher and environment start the ranks")
    parser.add_argument("--batch-per-rank", type=int, default=64, help="images per rank per iteration (default 64)")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--framework", default=DEFAULT_FRAMEWORK, metavar="NAME",
                        help="the trainer's backend and the bare loop's framework: tensorflow (default) or pytorch")
    parser.add_argument("--process-group", default="auto", metavar="NAME",
                        help="pytorch: the process group of both sides, as firescale train's --process-group (auto, "
                             "gloo, mpi, nccl; default auto: on CPU ranks mpirun starts, MPI)")
    parser.add_argument("--json", help="write the rows and load averages here")
    parser.epilog = ("The bare loop keeps its batches in memory. With tensorflow (python -m firescale.bench.bare_loop) "
                     "each iteration is one tf.function: gradients, one grouped Horovod allreduce, Caffe's update; "
                     "with pytorch (python -m firescale.bench.bare_loop_torch) it is eager: forward, "
                     "torch.autograd.grad, one all_reduce of the gradients and loss flattened into one buffer, "
                     "Caffe's update.")


def run(args: argparse.Namespace) -> int:
    from firescale.bench.trainer import TRAINER_FORMAT, TrainerBenchRuns, compare_trainer
    from firescale.cluster.ranks import site_ranks
    from firescale.cluster.site import load_site
    from firescale.commands.args import int_list
    from firescale.data.manifest import load_manifest
    from firescale.frameworks import DEFAULT_PRECISION, check_combination

    chosen = check_combination(args.framework, DEFAULT_PRECISION, args.process_group)
    group = args.process_group if chosen.names_process_group else None   # else its ranks are its library's
    if args.batch_per_rank < 1 or args.iterations < 1:
        raise FirescaleError("--batch-per-rank and --iterations must be at least 1")
    load_manifest(args.dataset)   # names the file when it is missing or not a firescale manifest
    site = load_site(args.site)

    def go(workdir: Path) -> int:
        runs = TrainerBenchRuns(args.dataset.resolve(), args.net, args.solver.resolve(), args.batch_per_rank,
                                args.iterations, workdir, site_ranks(site), framework=args.framework,
                                process_group=args.process_group)
        load_before = os.getloadavg()[0]
        rows = compare_trainer(runs, int_list(args.ranks), args.repeats, say=print)
        load_after = os.getloadavg()[0]
        print(f"load average before {load_before:.2f}, after {load_after:.2f} (1 min) on {os.cpu_count()} cores; "
              f"framework {args.framework}" + (f", process group {group}" if group else ""))
        print(f"{'framework':<10} {'ranks':>5} {'batch/rank':>10} {'trainer img/s':>13} {'bare img/s':>10} "
              f"{'trainer % of bare':>17} "
              f"{'(fastest runs)':>14} {'last loss trainer/bare':>22}")
        for r in rows:
            print(f"{r.framework:<10} {r.ranks:>5} {r.batch_per_rank:>10} {statistics.median(r.trainer):>13.0f} "
                  f"{statistics.median(r.bare):>10.0f} {r.percent:>16.1f}% {r.best_percent:>13.1f}% "
                  f"{r.trainer_loss:>11.4f} / {r.bare_loss:.4f}")
        if args.json:
            atomic_write_json(args.json, {"format": TRAINER_FORMAT, "site": site.name, "framework": args.framework,
                                          "process_group": group,
                                          "net": args.net,
                                          "iterations": args.iterations, "repeats": args.repeats,
                                          "load_average": [load_before, load_after], "cpus": os.cpu_count(),
                                          "rows": [r.to_dict() for r in rows]})
        return 0

    if args.workdir:
        return go(args.workdir)
    with tempfile.TemporaryDirectory(prefix="firescale-bench-trainer-") as tmp:
        return go(Path(tmp))

