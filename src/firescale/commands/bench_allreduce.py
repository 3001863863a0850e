"""`firescale bench allreduce`: parameter server vs reduction tree vs ring, measured beside predicted."""
from __future__ import annotations

import argparse

from firescale.commands.args import add_platform_arguments, float_list, input_shape, platform_from_args
from firescale.frameworks import BENCH_ALGORITHMS, DEFAULT_FRAMEWORK, PROCESS_GROUPS, REGISTRY


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
    parser.add_argument("--framework", default=DEFAULT_FRAMEWORK, metavar="NAME",
                        help="whose trainer's allreduce may be timed: "
                             + " or ".join(f"{f.name} ('{f.algorithm}': its Rank.sum)" for f in REGISTRY.values())
                             + f" (default {DEFAULT_FRAMEWORK}; see --process-groups)")
    parser.add_argument("--algorithms",
                        help=f"comma-separated, from {', '.join(BENCH_ALGORITHMS)} (default "
                             + "; ".join(f"{','.join(f.bench_default)} with --framework {f.name}"
                                         for f in REGISTRY.values()) + ")")
    parser.add_argument("--process-groups", metavar="LIST",
                        help="with torch: the process groups to time its allreduce over, each in turn, "
                             f"comma-separated from {', '.join(PROCESS_GROUPS)} as the trainer's --process-group "
                             "takes them "
                             "(default auto: NCCL on GPUs; on CPUs MPI through mpi4py under an MPI launcher, else "
                             "Gloo); e.g. gloo,mpi to set both beside plain MPI in one run")
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
                     "(Rank.sum: the tensors flattened, one all_reduce over the process group: MPI_Allreduce in "
                     "place through mpi4py, Gloo's or NCCL's), timed as 'mpi' is.  'mpi' and 'horovod' are "
                     "predicted with the site's allreduce model, 'torch' with its process group's (Gloo's ring, "
                     "else the site's).")


def run(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from firescale.bench.allreduce_vs_model import allreduce_bench, bench_link, bench_sizes, run_allreduce_bench

    bench = allreduce_bench(args.framework, args.algorithms, reps=args.reps, compute_ms=args.compute_ms,
                            batch_per_rank=args.batch_per_rank, overlap_ms=args.overlap_ms,
                            process_groups=args.process_groups)
    platform = platform_from_args(args) if args.site or args.bandwidth_gbits else None
    link, site_algorithm = bench_link(platform, reduce_gbs=args.reduce_gbs, from_site=bool(args.site))
    sizes = bench_sizes(sweep=args.sweep, sizes_mb=args.sizes_mb, gradients_of=args.gradients_of,
                        input_shape=args.input, classes=args.classes)
    run_allreduce_bench(MPI.COMM_WORLD, bench, sizes, link, site_algorithm, json_path=args.json)
    return 0
