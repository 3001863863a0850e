"""`firescale predict calibrate`: fit percent-of-peak factors, the overhead and a read bandwidth; store them."""
from __future__ import annotations

import argparse
import signal

from firescale.cluster.ranks import CONTENTION_ROUNDS, PROBE_ROUNDS, PROBE_TIMEOUT_S, RUN_TIMEOUT_S
from firescale.commands.args import (
    add_platform_arguments,
    describe,
    input_shape,
    net_name,
    platform_from_args,
    site_or_none,
)
from firescale.nets.zoo import NET_NAMES
from firescale.predict.calibration_run import CalibrationRequest, run_calibration
from firescale.sweep.paths import CALIBRATION_FILE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record", action="append", default=[], metavar="RESULT.json",
                        help="a single-rank run record (results/<site>/<experiment>/runs/baseline/result.json) or "
                             "a trainer result.json; repeat for more batch sizes (two sizes fit the overhead) or "
                             "for repeats of one (the fit goes through their mean)")
    parser.add_argument("--short-run", type=int, metavar="ITERATIONS",
                        help="also run the first record's trainer command on one rank for this many iterations "
                             "at --short-batch, so that the baseline alone fits the overhead too")
    parser.add_argument("--short-batch", type=int,
                        help="per-rank batch of the short run (default: half the first record's)")
    parser.add_argument("--short-runs", type=int, default=1, metavar="N",
                        help="start the short run N times, one after another: the fit goes through their mean, as "
                             "through the records' at one batch, and the contention compares with it (default 1; "
                             "the workflow starts it as often as the experiment repeats its baseline); a run that "
                             "fails or runs out of --run-timeout is left out")
    parser.add_argument("--workdir", help="where the short run writes (default: a temporary directory)")
    parser.add_argument("--net", type=net_name,
                        help=f"network (default: the record's): {', '.join(NET_NAMES)}, or a Caffe net file")
    parser.add_argument("--input", type=input_shape,
                        help="input H,W,C (default: the record's dataset manifest, else the net's own)")
    parser.add_argument("--classes", type=int, help="classes (default: the record's dataset manifest, else the net's)")
    parser.add_argument("--batch", type=int, help="batch of a single-device run given by numbers (with --iteration-s)")
    parser.add_argument("--iteration-s", type=float, help="its measured seconds per iteration")
    parser.add_argument("--allreduce-json", help="JSON written by `firescale bench allreduce --json`; fits the "
                                                  "communication factor from its largest run of the site's algorithm")
    parser.add_argument("--comm-record", metavar="RESULT.json",
                        help="a run record of 2 or more ranks: fits the communication factor from the trainer's own "
                             "mean allreduce time for this net's gradients (instead of --allreduce-json)")
    parser.add_argument("--allreduce-probe", type=int, metavar="RANKS",
                        help="time the trainer's allreduce of this net's gradients (Horovod's, or with "
                             "--framework pytorch its sum over --process-group) over RANKS ranks started as --site "
                             "starts them, and fit the communication factor from the fastest of --probe-rounds "
                             "probes (on a site with a scheduler, only inside one of its jobs: the workflow's "
                             "calibration job); with --short-run, the short run is also started once for each rank "
                             "of a node at once, to measure how much slower ranks sharing a node compute (and, "
                             "when RANKS span nodes, as many on each of them at once)")
    parser.add_argument("--contention-rounds", type=int, default=CONTENTION_ROUNDS, metavar="N",
                        help="how many times to start the short run's copies for the contention; the median "
                             f"factor is taken, as one round's copies can all be slowed at once (default "
                             f"{CONTENTION_ROUNDS}); a round that fails or runs out of --run-timeout is left out")
    parser.add_argument("--run-timeout", type=float, default=RUN_TIMEOUT_S, metavar="SECONDS",
                        help="stop the short run, or a step of its copies, that has not finished by then "
                             f"(default {RUN_TIMEOUT_S:g}; the workflow's calibration job fits them into the half of "
                             "its walltime the probe rounds leave)")
    parser.add_argument("--probe-rounds", type=int, default=PROBE_ROUNDS, metavar="N",
                        help="how many times to start the allreduce probe; the fastest is taken, as the least "
                             f"disturbed (default {PROBE_ROUNDS})")
    parser.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT_S, metavar="SECONDS",
                        help="stop a probe round that has not finished by then, with its ranks, and leave it out "
                             f"(default {PROBE_TIMEOUT_S:g}; a round takes under a minute on the virtual cluster; "
                             "the workflow's calibration job fits its rounds into half its walltime)")
    parser.add_argument("--probe-overlap", action="store_true",
                        help="with --allreduce-probe: also time the allreduce requested as the step's backward "
                             "pass starts, as an experiment with overlap_allreduce requests it, and store the "
                             "share of it that ran beside the compute (the share the overlapped schedule hides; "
                             "without it a CPU site hides none)")
    parser.add_argument("--framework", metavar="NAME",
                        help="the backend whose trainer's allreduce --allreduce-probe times: tensorflow (Horovod's, "
                             "after a step shaped as the trainer's) or pytorch (over its process group, on its own) "
                             "(default: the first record's, else tensorflow)")
    parser.add_argument("--process-group", metavar="NAME",
                        help="with --framework pytorch: the process group the runs sum over (auto, gloo, mpi, nccl, "
                             "as `firescale train --process-group`; default: the first record's, else auto); the "
                             "probe times the allreduce over it, and the fit prices it as that group runs it "
                             "(Gloo's ring, MPI's and NCCL's as the site sets them)")
    parser.add_argument("--io-record", metavar="BENCH_IO.json",
                        help="JSON written by `firescale bench io --json`: stores its raw sequential read as one "
                             "node's read bandwidth, which gives t_io on a site whose storage has no "
                             "read_gbytes_per_s (the site's key wins)")
    parser.add_argument("--io-format", choices=("lmdb", "hdf5"),
                        help="the format of --io-record to take (default: lmdb when measured, as the trainer reads)")
    parser.add_argument("--out", help=f"where to write it (default: the site's results dir/{CALIBRATION_FILE})")
    add_platform_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """As _calibrate; a TERM (the calibration job's walltime or cancel) interrupts it as Ctrl-C does, so that
    the ranks it started are stopped with it."""
    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        return _calibrate(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _calibrate(args: argparse.Namespace) -> int:
    platform = platform_from_args(args)
    request = CalibrationRequest(
        records=tuple(args.record), batch=args.batch, iteration_s=args.iteration_s, net=args.net,
        input_shape=args.input, classes=args.classes, short_run=args.short_run, short_batch=args.short_batch,
        short_runs=args.short_runs, workdir=args.workdir, allreduce_json=args.allreduce_json,
        comm_record=args.comm_record, allreduce_probe=args.allreduce_probe, probe_rounds=args.probe_rounds,
        probe_timeout=args.probe_timeout, probe_overlap=args.probe_overlap,
        framework=args.framework, process_group=args.process_group, contention_rounds=args.contention_rounds,
        run_timeout=args.run_timeout, io_record=args.io_record, io_format=args.io_format, out=args.out)
    done = run_calibration(request, platform, site_or_none(args), say=lambda line: print(line, flush=True))
    print(describe(done.calibration.apply(platform)))
    print(done.summary())
    return 0
