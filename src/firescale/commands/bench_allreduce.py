"""`firescale bench allreduce`: parameter server vs reduction tree vs ring, measured beside predicted."""
from __future__ import annotations

import argparse
import os
import statistics

from firescale.atomic import atomic_write_json
from firescale.bench.allreduce import (
    BENCH_ALGORITHMS,
    FRAMEWORK_ALGORITHMS,
    SWEEP_BYTES,
    AllreduceMeasurement,
    framework_last,
    horovod_vs_mpi,
    measure_allreduce,
    torch_vs_mpi,
)
from firescale.commands.args import add_platform_arguments, float_list, input_shape, platform_from_args
from firescale.model.comm import Link, allreduce_time

# The models each measured algorithm is predicted with, the first in `predicted_s`.  The point-to-point
# parameter server is Paleo's OneToAll as it runs; FireCaffe's Eq. 3 is shown beside it.
BENCH_MODELS = {"ps": ("ps", "firecaffe-ps")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes-mb", type=float_list,
                        help="gradient sizes in MB (default 30, NiN's |W|)")
    parser.add_argument("--gradients-of", metavar="NET",
                        help="the gradients of this net (with --input and --classes) instead of --sizes-mb: "
                             "Horovod sums them as one group of tensors, as the trainer does (fusion buffer "
                             "copies included); the MPI algorithms reduce their bytes as one buffer")
    parser.add_argument("--input", type=input_shape,
                        help="with --gradients-of: the net's input H,W,C (default: the net's own)")
    parser.add_argument("--classes", type=int, help="with --gradients-of: the net's classes (default: the net's own)")
    parser.add_argument("--sweep", action="store_true",
                        help="sizes 64 KiB, 256 KiB, 1 MiB, 4 MiB, 16 MiB and 64 MiB instead of --sizes-mb")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per size (default 5)")
    parser.add_argument("--framework", default="tensorflow", metavar="NAME",
                        help="whose trainer's allreduce may be timed: tensorflow (default; 'horovod') or pytorch "
                             "('torch': torch.distributed's all_reduce, Gloo on CPUs, NCCL on GPUs)")
    parser.add_argument("--algorithms",
                        help=f"comma-separated, from {', '.join(BENCH_ALGORITHMS)} (default ps,tree,ring; with "
                             "--framework pytorch mpi,torch)")
    parser.add_argument("--reduce-gbs", type=float,
                        help="rate at which a rank sums received gradients, GB/s (default: none modelled, "
                             "or the site's memory bandwidth / 3)")
    parser.add_argument("--compute-ms", type=float, default=0.0,
                        help="before each allreduce, a synthetic single-threaded TensorFlow step of about this "
                             "long; the ranks' mean step in each repetition is subtracted from its slowest rank's "
                             "total: communication as a training iteration pays it (the allreduce and waiting for "
                             "the slowest rank); default 0.  Horovod's then runs inside an iteration shaped as "
                             "the trainer's, fed images of the net's input each time")
    parser.add_argument("--batch-per-rank", type=int, default=1,
                        help="with --compute-ms: images per rank the host passes to Horovod's iteration each time, "
                             "as the trainer passes its batch (default 1)")
    parser.add_argument("--overlap-ms", type=float, default=0.0,
                        help="with horovod and --compute-ms: also time the allreduce's requests made as compute of "
                             "about this long starts (the backward pass the trainer's --overlap-allreduce hides "
                             "it behind), and give the share of it that ran beside that compute")
    parser.add_argument("--json", help="write measured and predicted times to this JSON file (rank 0)")
    add_platform_arguments(parser, device=False)
    parser.epilog = ("Run under a launcher, e.g. mpirun -np 4 firescale bench allreduce.  'mpi' is "
                     "MPI_Allreduce as configured by the environment (OMPI_MCA_coll_tuned_*), which must "
                     "be set before launch; ps, tree and ring are explicit point-to-point implementations; "
                     "'horovod' is the TensorFlow trainer's own allreduce (Horovod's TensorFlow op over that MPI), "
                     "the one to calibrate the communication factor from; 'torch' is the PyTorch trainer's "
                     "(Rank.sum: the tensors flattened, one torch.distributed all_reduce, Gloo on CPUs and NCCL on "
                     "GPUs), timed as 'mpi' is.  'mpi', 'horovod' and 'torch' are predicted with the site's "
                     "allreduce model.")


def _link(args: argparse.Namespace) -> tuple[Link | None, str]:
    if not (args.site or args.bandwidth_gbits):
        return None, "tree"
    platform = platform_from_args(args)
    link = platform.link
    if args.reduce_gbs:
        from dataclasses import replace
        link = replace(link, reduce_rate=args.reduce_gbs * 1e9)
    elif args.site:
        from dataclasses import replace

        from firescale.cluster.site import load_site
        link = replace(link, reduce_rate=load_site(args.site).device_memory_bandwidth / 3)
    return link, platform.algorithm


def _sizes(args: argparse.Namespace) -> tuple[list[int], tuple[int, ...], tuple[int, ...]]:
    """The bytes to reduce, with --gradients-of the net's gradient tensors (element counts) they make up,
    and the input shape of the images fed to Horovod's iteration (the net's, else one pixel)."""
    from firescale.errors import FirescaleError

    given = [name for name, value in (("--sweep", args.sweep), ("--sizes-mb", args.sizes_mb),
                                      ("--gradients-of", args.gradients_of)) if value]
    if len(given) > 1:
        raise FirescaleError(f"give one of --sweep, --sizes-mb and --gradients-of, not {' and '.join(given)}")
    if (args.input or args.classes is not None) and not args.gradients_of:
        raise FirescaleError("--input and --classes describe the net of --gradients-of; give it too")
    if args.gradients_of:
        from firescale.model.layers import net_cost
        from firescale.nets.zoo import get_net

        spec = get_net(args.gradients_of, num_classes=args.classes, input_shape=args.input)
        cost = net_cost(spec, 1)
        return [cost.weight_bytes], cost.gradient_tensors, tuple(spec.input_shape)
    if args.sweep:
        return list(SWEEP_BYTES), (), (1, 1, 1)
    return [int(mb * 1e6) for mb in (args.sizes_mb or [30.0])], (), (1, 1, 1)


def _models(algorithm: str, site_algorithm: str) -> tuple[str, ...]:
    """The cost models a measured algorithm is set beside: its own (the site's for mpi and horovod)."""
    if algorithm in ("mpi", *FRAMEWORK_ALGORITHMS.values()):
        return (site_algorithm,)
    return BENCH_MODELS.get(algorithm, (algorithm,))


Predicted = dict[str, float]   # seconds by cost model; empty without a link


def _print(ranks: int, args: argparse.Namespace, results: list[tuple[AllreduceMeasurement, Predicted]],
           knobs: dict[str, str], load: tuple[float, float]) -> None:
    grouped = next((m.tensors for m, _ in results if m.tensors), 0)
    library = {"tensorflow": "Horovod", "pytorch": "torch.distributed"}[args.framework]
    print(f"{ranks} ranks, {args.reps} repetitions; times are the slowest rank's"
          + (f"; {library} sums {args.gradients_of}'s {grouped} gradients and the loss as one group" if grouped
             else "")
          + (f", after a {args.compute_ms:g} ms step (the ranks' mean step subtracted)" if args.compute_ms else ""))
    print(f"load average {load[0]:.2f} before, {load[1]:.2f} after (1 min) on {os.cpu_count()} cores; "
          + (f"framework {args.framework}" if args.framework != "tensorflow" else "Horovod knobs: "
             + (" ".join(f"{k}={v}" for k, v in knobs.items()) or "Horovod's defaults")))
    print(f"{'algorithm':<10} {'ranks':>5} {'MB':>8} {'median ms':>10} {'min ms':>9} {'model':>15} "
          f"{'predicted ms':>13} {'meas/pred':>10}")
    for m, predicted in results:
        rows: list[tuple[str, float | None]] = list(predicted.items()) or [("-", None)]
        for model, pred in rows:
            ratio = f"{m.median_s / pred:.2f}" if pred else "-"
            print(f"{m.algorithm:<10} {m.ranks:>5} {m.bytes / 1e6:>8.3f} {m.median_s * 1e3:>10.3f} "
                  f"{m.min_s * 1e3:>9.3f} {model:>15} {(f'{pred * 1e3:.3f}' if pred is not None else '-'):>13} "
                  f"{ratio:>10}")
    for m, _ in results:
        if m.hidden_share is not None:
            print(f"overlapped: Horovod's allreduce of {m.bytes / 1e6:.3f} MB started beside "
                  f"{m.window_s * 1e3:.3f} ms of compute added {statistics.fmean(m.overlapped_seconds) * 1e3:.3f} ms "
                  f"(mean), against {m.mean_s * 1e3:.3f} ms after the step: {m.hidden_share:.0%} of it ran beside "
                  "the compute")
    pairs = horovod_vs_mpi([m for m, _ in results])
    if pairs:
        print(f"{'KiB':>8} {'MPI ms':>9} {'Horovod ms':>11} {'Horovod % of MPI rate':>22} {'(fastest reps)':>15} "
              f"{'graph call ms':>14} {'% without it':>13}")
        for p in pairs:
            print(f"{p.bytes / 1024:>8.0f} {p.mpi_s * 1e3:>9.3f} {p.horovod_s * 1e3:>11.3f} {p.percent_of_mpi:>21.1f}% "
                  f"{p.best_percent_of_mpi:>14.1f}% {p.graph_call_s * 1e3:>14.3f} {p.in_graph_percent_of_mpi:>12.1f}%")
        print("graph call: the same TensorFlow call and wait with tf.identity in place of Horovod's op, which a "
              "training step pays once whatever its graph holds")
    torch_pairs = torch_vs_mpi([m for m, _ in results])
    if torch_pairs:
        group = next(m.process_group for m, _ in results if m.process_group)
        print(f"{'KiB':>8} {'MPI ms':>9} {'torch ms':>9} {'torch % of MPI rate':>20} {'(fastest reps)':>15}   "
              f"(torch.distributed over {group})")
        for t in torch_pairs:
            print(f"{t.bytes / 1024:>8.0f} {t.mpi_s * 1e3:>9.3f} {t.torch_s * 1e3:>9.3f} {t.percent_of_mpi:>19.1f}% "
                  f"{t.best_percent_of_mpi:>14.1f}%")


def _algorithms(args: argparse.Namespace) -> list[str]:
    """--algorithms, checked: known names, and of the frameworks' own allreduces only --framework's."""
    from firescale.errors import FirescaleError

    given = args.algorithms or ("mpi,torch" if args.framework == "pytorch" else "ps,tree,ring")
    algorithms = [a.strip() for a in given.split(",") if a.strip()]
    unknown = [a for a in algorithms if a not in BENCH_ALGORITHMS]
    if unknown:
        raise FirescaleError(f"--algorithms: unknown {', '.join(unknown)}; known: {', '.join(BENCH_ALGORITHMS)}")
    ours = FRAMEWORK_ALGORITHMS[args.framework]
    other = [a for a in algorithms if a in FRAMEWORK_ALGORITHMS.values() and a != ours]
    if other:
        raise FirescaleError(f"--algorithms {other[0]} is another framework's allreduce than --framework "
                             f"{args.framework}'s ({ours}); give --framework "
                             f"{next(f for f, a in FRAMEWORK_ALGORITHMS.items() if a == other[0])} to time it")
    return algorithms


def run(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from firescale.cluster.horovod import recorded_knobs
    from firescale.errors import FirescaleError
    from firescale.train.backend import check_framework

    check_framework(args.framework)
    algorithms = _algorithms(args)
    if args.reps < 1:
        raise FirescaleError("--reps must be at least 1")
    if not args.compute_ms >= 0:
        raise FirescaleError(f"--compute-ms must be 0 or more, not {args.compute_ms}")
    if args.batch_per_rank < 1:
        raise FirescaleError(f"--batch-per-rank must be at least 1, not {args.batch_per_rank}")
    if not args.overlap_ms >= 0:
        raise FirescaleError(f"--overlap-ms must be 0 or more, not {args.overlap_ms}")
    if args.compute_ms and args.framework == "pytorch":
        raise FirescaleError("--compute-ms runs a synthetic TensorFlow step; with --framework pytorch the allreduces "
                             "are timed on their own (leave --compute-ms out)")
    if args.overlap_ms and not (args.compute_ms > 0 and "horovod" in algorithms):
        raise FirescaleError("--overlap-ms times Horovod's allreduce beside compute: give --algorithms with horovod "
                             "and --compute-ms")
    comm = MPI.COMM_WORLD
    link, site_algorithm = _link(args)
    sizes, tensors, shape = _sizes(args)
    load_before = os.getloadavg()[0]
    results = []
    for algo in framework_last(algorithms):
        for nbytes in sizes:
            m = measure_allreduce(comm, algo, nbytes, args.reps, compute_s=args.compute_ms / 1e3, tensors=tensors,
                                  batch=args.batch_per_rank, input_shape=shape,
                                  overlap_s=args.overlap_ms / 1e3 if algo == "horovod" else 0.0)
            predicted = {model: allreduce_time(model, m.bytes, m.ranks, link)
                         for model in _models(algo, site_algorithm)} if link else {}
            results.append((m, predicted))
    if comm.Get_rank() != 0:
        return 0
    load = (load_before, os.getloadavg()[0])
    knobs = recorded_knobs(os.environ)
    _print(comm.Get_size(), args, results, knobs, load)
    if args.json:
        atomic_write_json(args.json, {
            "ranks": comm.Get_size(), "framework": args.framework, "reps": args.reps, "compute_ms": args.compute_ms,
            "gradients_of": args.gradients_of,
            "load_average": list(load), "cpus": os.cpu_count(), "horovod_knobs": knobs,
            "link": None if link is None else {"bandwidth": link.bandwidth, "latency": link.latency,
                                               "ppp": link.ppp, "reduce_rate": link.reduce_rate},
            "measurements": [{**m.to_dict(), "predicted_s": next(iter(pred.values()), None),
                              "predicted_by_model": pred} for m, pred in results],
            "horovod_vs_mpi": [p.to_dict() for p in horovod_vs_mpi([m for m, _ in results])],
            "torch_vs_mpi": [t.to_dict() for t in torch_vs_mpi([m for m, _ in results])]})
    return 0
