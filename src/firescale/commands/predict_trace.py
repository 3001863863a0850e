"""`firescale predict trace TRACE`: replay a layer-wise trace through the DAG model, naive and wait-free."""
from __future__ import annotations

import argparse

from firescale.atomic import atomic_write_json
from firescale.commands.args import add_platform_arguments, int_list, platform_from_args
from firescale.errors import FirescaleError
from firescale.model.dag import dag_speedup
from firescale.model.traces import read_trace, replay_trace, retarget_comm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file (.csv or .json; columns of the DAG paper's Table VI)")
    parser.add_argument("--gpus", type=int_list,
                        help="model communication for these device counts (needs a platform); "
                             "without it the trace's own comm_us is replayed")
    parser.add_argument("--io-us", type=float, default=0.0,
                        help="I/O time per iteration (µs): in series without overlap, beside compute with it")
    parser.add_argument("--h2d-us", type=float, default=0.0,
                        help="host-to-device copy of a batch (µs), with the I/O")
    parser.add_argument("--update-us", type=float, default=0.0, help="model update time per iteration (µs)")
    parser.add_argument("--json", help="write the schedules to this JSON file")
    add_platform_arguments(parser, device=False)


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--io-us", args.io_us), ("--h2d-us", args.h2d_us), ("--update-us", args.update_us)):
        if not value >= 0:
            raise FirescaleError(f"{flag} must be a time of 0 µs or more, not {value}")
    trace = read_trace(args.trace)
    times = {"io_us": args.io_us, "h2d_us": args.h2d_us, "update_us": args.update_us}
    cases = []
    if args.gpus:
        platform = platform_from_args(args)
        base = replay_trace(retarget_comm(trace, platform.algorithm, 1, platform.link), **times)
        for g in args.gpus:
            t = retarget_comm(trace, platform.algorithm, g, platform.link)
            cases.append((g, replay_trace(t, overlap=False, **times), replay_trace(t, overlap=True, **times)))
    else:
        base = None
        cases.append((None, replay_trace(trace, overlap=False, **times), replay_trace(trace, overlap=True, **times)))
    print(f"{args.trace}: {len(trace)} layers, gradients {sum(r.gradient_bytes for r in trace):,} bytes")
    wait = cases[0][1].data_wait
    if wait:
        print(f"data wait {wait / 1e3:.3f} ms as measured (exposed I/O): in series in both schedules")
    head = (f"{'gpus':>5} {'fwd ms':>9} {'bwd ms':>9} {'comm ms':>9} {'iter ms (no overlap, Eq. 2)':>27} "
            f"{'iter ms (wait-free, Eq. 5)':>26} {'exposed comm ms':>16} {'speedup (Eq. 6)':>16}")
    print(head)
    rows = []
    for g, plain, wfbp in cases:
        speedup = dag_speedup(base.iteration, wfbp.iteration, g) if base and g else None
        print(f"{g or '-':>5} {plain.forward / 1e3:>9.3f} {plain.backward / 1e3:>9.3f} {plain.comm / 1e3:>9.3f} "
              f"{plain.iteration / 1e3:>27.3f} {wfbp.iteration / 1e3:>26.3f} {wfbp.comm_exposed / 1e3:>16.3f} "
              f"{'' if speedup is None else f'{speedup:.2f}':>16}")
        rows.append({"gpus": g, "no_overlap": plain.__dict__, "wait_free": wfbp.__dict__, "speedup": speedup})
    if args.json:
        atomic_write_json(args.json, {"trace": str(args.trace), "unit": "us", "rows": rows})
    return 0
