"""`firescale bench predict`: the model's iteration time beside the real trainer's, for 1 and more ranks here."""
from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from firescale.atomic import atomic_write_json
from firescale.data.manifest import load_manifest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from firescale.commands.args import add_training_run_arguments

    add_training_run_arguments(parser, "site whose device, link, launcher and allreduce to use")
    parser.add_argument("--batch", type=int, default=64, help="total batch, split over the ranks (default 64)")
    parser.add_argument("--allreduce-json", help="`bench allreduce --json` output to fit the communication factor "
                                                 "(default: the workflow's probe, Horovod's allreduce inside an "
                                                 "iteration shaped as the trainer's, as long without it as the "
                                                 "per-rank batch's)")
    parser.add_argument("--fit-comm", action="store_true",
                        help="fit the communication factor from a separate run on the most ranks (the trainer's "
                             "own allreduce time) instead of leaving the link at its peak")
    parser.add_argument("--overlap-allreduce", action="store_true",
                        help="train the runs of several ranks with --overlap-allreduce and predict them with the "
                             "DAG model's overlapped schedule")
    parser.add_argument("--no-contention", action="store_true",
                        help="leave the node's contention out (by default, where the most ranks put several on a "
                             "node, the single-rank run is started once for each of them at once, once a round: on "
                             "as many cores here as the workflow's calibration does, or as one srun step on one "
                             "of the site's nodes and one on each node of the most ranks at once; the model scales "
                             "compute by the slowdown)")
    parser.add_argument("--tolerance", type=float, default=15.0, help="percent counted as a match (default 15)")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--json", help="write calibration, rows and load averages here")


def run(args: argparse.Namespace) -> int:
    from firescale.cluster.ranks import contention_nodes, copies_step, node_probe_ranks, probe_allreduce, site_ranks
    from firescale.cluster.site import load_site
    from firescale.commands.args import describe, int_list
    from firescale.model.layers import net_cost
    from firescale.model.paleo import backward_share, platform_from_site
    from firescale.nets.zoo import get_net
    from firescale.predict.calibrate import allreduce_measurement
    from firescale.predict.measurements import MeasuredIteration, node_contentions
    from firescale.predict.validation import TrainRuns, prediction_check

    site = load_site(args.site)
    ranks = int_list(args.ranks)
    manifest = load_manifest(args.dataset)   # names the file when it is missing or not a firescale manifest
    spec = get_net(args.net, num_classes=int(manifest["num_classes"]), input_shape=tuple(manifest["shape"]))
    platform = platform_from_site(site)
    here = site_ranks(site)
    per_node = here.on_a_node(max(ranks))   # the ranks of the most ranks' point on one node
    algorithm, gradient_bytes = platform.algorithm, net_cost(spec, 1).weight_bytes
    allreduce = allreduce_measurement(args.allreduce_json, algorithm, gradient_bytes) if args.allreduce_json else None

    def probe(workdir: Path) -> Callable[[float], dict]:
        """The workflow's communication measurement: Horovod's allreduce of the net's gradients after a step
        of the given length; overlapped, also beside that step's backward pass (as the model splits it).  On
        a site with a link inside its nodes whose most ranks span nodes, also on one node's ranks alone:
        each link then gets a factor of its own."""
        per_rank = max(1, args.batch // max(ranks))
        window = backward_share(platform, spec, per_rank) if args.overlap_allreduce else 0.0
        within_node = node_probe_ranks(site, max(ranks)) > 0
        rounds = itertools.count()

        def one(count: int, out: Path, step_s: float) -> dict:
            probe_allreduce(here, count, spec, out, step_s=step_s, batch_per_rank=per_rank, overlap_s=step_s * window)
            return allreduce_measurement(str(out), algorithm, gradient_bytes)

        def measure(step_s: float) -> dict:
            k = next(rounds)
            found = one(max(ranks), workdir / f"allreduce-probe-{k}.json", step_s)
            if not within_node:
                return found
            return {**found, "intra": one(per_node, workdir / f"allreduce-node-probe-{k}.json", step_s)}

        return measure

    def contend(workdir: Path) -> Callable[[MeasuredIteration], list[dict]]:
        """The workflow's contention measurement: the round's small-batch run again as one copy for each rank of
        a node, all at once: on as many cores here, or as tasks of one step on one of the site's nodes, and
        where the most ranks span nodes, as many on each of them at once."""
        rounds, node, nodes = itertools.count(), copies_step(site), contention_nodes(site, max(ranks))

        def measure(alone: MeasuredIteration) -> list[dict]:
            where = workdir / f"contention-round-{next(rounds)}"
            where.mkdir(parents=True)
            return node_contentions(alone, alone, per_node, args.iterations, where,
                                    node=node, nodes=nodes)

        return measure

    shares_node = per_node > 1 and not args.no_contention

    def go(workdir: Path) -> int:
        runs = TrainRuns(args.dataset.resolve(), args.net, args.solver.resolve(), args.iterations, workdir,
                         here, reference_batch=args.batch, overlap_allreduce=args.overlap_allreduce)
        load_before = os.getloadavg()
        cal, rows = prediction_check(runs, spec, platform, args.batch, ranks, args.repeats,
                                     allreduce=allreduce, fit_comm=args.fit_comm, say=print,
                                     probe=None if (allreduce or args.fit_comm or max(ranks) < 2) else probe(workdir),
                                     contend=contend(workdir) if shares_node else None)
        load_after = os.getloadavg()
        print(describe(cal.apply(platform)))
        if shares_node:
            print(f"contention: compute of {per_node} ranks on one node at once scaled by {cal.contention:.3f} "
                  "(median of the rounds)"
                  + "".join(f"; on each of {n} nodes at once by {f:.3f}" for n, f in cal.contention_across))
        print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min) on {os.cpu_count()} cores")
        print(f"{'ranks':>5} {'batch/rank':>10} {'predicted ms':>12} {'(comm ms)':>9} {'(wait ms)':>9} {'best ms':>8} "
              f"{'median ms':>9} {'max ms':>7} {'error % (best)':>14} {'(median)':>8}")
        for r in rows:
            print(f"{r.ranks:>5} {r.batch_per_rank:>10} {r.predicted_s * 1e3:>12.3f} {r.comm_s * 1e3:>9.3f} "
                  f"{r.cycle_wait_s * 1e3:>9.3f} "
                  f"{r.best_s * 1e3:>8.3f} {r.median_s * 1e3:>9.3f} {max(r.measured_s) * 1e3:>7.2f} "
                  f"{r.error_percent:>+14.1f} {r.error_median_percent:>+8.1f}"
                  + ("" if abs(r.error_percent) <= args.tolerance else "  outside"))
        if args.json:
            atomic_write_json(args.json, {"site": site.name, "net": spec.name, "total_batch": args.batch,
                                          "overlap_allreduce": args.overlap_allreduce,
                                          "iterations": args.iterations, "repeats": args.repeats,
                                          "load_average": [load_before[0], load_after[0]], "cpus": os.cpu_count(),
                                          "calibration": cal.to_dict(), "rows": [r.to_dict() for r in rows]})
        return 0

    if args.workdir:
        return go(args.workdir)
    with tempfile.TemporaryDirectory(prefix="firescale-bench-predict-") as tmp:
        return go(Path(tmp))
