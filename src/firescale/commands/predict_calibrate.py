"""`firescale predict calibrate`: fit percent-of-peak factors, the overhead and a read bandwidth; store them."""
from __future__ import annotations

import argparse
import signal
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from firescale.cluster.ranks import CONTENTION_ROUNDS, PROBE_ROUNDS, PROBE_TIMEOUT_S, RUN_TIMEOUT_S
from firescale.commands.args import (
    add_platform_arguments,
    describe,
    input_shape,
    net_name,
    platform_from_args,
    site_or_none,
)
from firescale.data.manifest import manifest_if_ingested
from firescale.errors import FirescaleError
from firescale.model.layers import net_cost
from firescale.model.paleo import Platform
from firescale.nets.spec import NetSpec
from firescale.nets.zoo import NET_NAMES, get_net
from firescale.predict.calibrate import (
    allreduce_from_run,
    allreduce_measurement,
    calibrate,
    read_bandwidth_measurement,
    save_calibration,
)
from firescale.predict.measurements import (
    MeasuredIteration,
    contention_medians,
    mean_iteration,
    node_contentions,
    read_measured_iteration,
    short_run,
)
from firescale.sweep.paths import CALIBRATION_FILE

T = TypeVar("T")


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
                        help="time Horovod's allreduce of this net's gradients over RANKS ranks started as --site "
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
    parser.add_argument("--io-record", metavar="BENCH_IO.json",
                        help="JSON written by `firescale bench io --json`: stores its raw sequential read as one "
                             "node's read bandwidth, which gives t_io on a site whose storage has no "
                             "read_gbytes_per_s (the site's key wins)")
    parser.add_argument("--io-format", choices=("lmdb", "hdf5"),
                        help="the format of --io-record to take (default: lmdb when measured, as the trainer reads)")
    parser.add_argument("--out", help=f"where to write it (default: the site's results dir/{CALIBRATION_FILE})")
    add_platform_arguments(parser)


def _net_shape(args: argparse.Namespace, first: MeasuredIteration | None) -> tuple:
    """Input shape and classes: explicit options, else the first record's dataset manifest and crop."""
    shape = args.input
    classes = args.classes
    if first is not None and (shape is None or classes is None):
        data = manifest_if_ingested(first.dataset)
        if data is not None:
            stored = tuple(int(v) for v in data["shape"])
            crop = _option(first.command, "--crop")
            shape = shape or ((int(crop), int(crop), stored[2]) if crop else stored)
            classes = classes or int(data["num_classes"])
    return shape, classes


def _option(command: tuple[str, ...], name: str) -> str | None:
    for i, arg in enumerate(command):
        if arg == name and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _measuring_site(args: argparse.Namespace, what: str) -> Any:
    """The site whose ranks a measurement starts as its jobs start them: a site without a scheduler here, a
    site with one only from inside one of its jobs (where its launcher places ranks on the job's nodes)."""
    from firescale.jobs.schedulers import get_scheduler

    site = site_or_none(args)
    if site is None:
        raise FirescaleError(f"{what} starts ranks as a site does: give --site")
    scheduler = get_scheduler(site.scheduler)
    if site.scheduler != "local" and not scheduler.inside_job():
        by_hand = (", or run `firescale bench allreduce --algorithms horovod` in a job and pass its --json output "
                   "as --allreduce-json" if what == "--allreduce-probe" else "")
        raise FirescaleError(f"{what} measures on the nodes of site {site.name}, whose scheduler is "
                             f"{site.scheduler!r}, but this is not one of its jobs (${scheduler.job_id_variable} is "
                             "unset); the workflow runs it in its calibration job (results/<site>/<experiment>/jobs/"
                             f"calibration.sh){by_hand}")
    return site


def _contention(args: argparse.Namespace, baseline: MeasuredIteration, alone: MeasuredIteration,
                workdir: str) -> list[dict]:
    """The short run again once for each rank the probe's point puts on a node, all at once: the node's
    contention (none when it puts one a node).  On a Slurm site the copies are one job step on one node, and
    when the probe spans several nodes, a second step runs as many on each of them at once (what a point's
    nodes share, beside what a node's ranks share); elsewhere they run here, each on a core of its own (in
    a job, here is the job's first node).  --contention-rounds rounds, each in a folder of its own; a round
    that fails or runs out of --run-timeout is said and left out (all failing, the first failure is the
    error); the median factor of each node count."""
    from firescale.cluster.ranks import contention_nodes, copies_step, site_ranks

    site = _measuring_site(args, "--allreduce-probe")
    nodes = contention_nodes(site, args.allreduce_probe)
    if not nodes:
        return []
    copies, node = site_ranks(site).on_a_node(args.allreduce_probe), copies_step(site)
    def one(k: int) -> list[dict]:
        folder = Path(workdir) / f"contention-round-{k}"
        folder.mkdir(parents=True, exist_ok=True)
        found = node_contentions(alone, baseline, copies, args.short_run, folder, node=node, nodes=nodes,
                                 timeout=args.run_timeout)
        for c in found:
            where = "" if node is None else " on one node" if c["nodes"] == 1 else f" on each of {c['nodes']} nodes"
            below = "" if c["ratio"] >= 1 else ", taken as 1: the one alone was the disturbed run"
            print(f"measured: round {k + 1}: {c['copies']} copies of the short run at once{where} compute "
                  f"{c['ratio']:.3f} times as long as one alone ({c['alone_s'] * 1e3:.3f} ms){below}", flush=True)
        return found

    # a round goes whole: each has every node count or none
    measured = [c for found in _in_rounds(args.contention_rounds, "contention", one) if found for c in found]
    medians = contention_medians(measured)
    for c in medians:
        print(f"measured: contention {c['factor']:.3f} on {c['nodes']} node(s), the median of "
              f"{len(c['rounds'])} round(s)")
    return medians


def _in_rounds(rounds: int, what: str, measure: Callable[[int], T]) -> list[T | None]:
    """measure(k) for each of `rounds` rounds, in turn: a round that fails (a FirescaleError: it failed, ran
    out of its time limit or measured nonsense) is said in one line and left out (None in its place); all
    failing, the first failure is the error."""
    found: list[T | None] = []
    failures: list[FirescaleError] = []
    for k in range(rounds):
        try:
            found.append(measure(k))
        except FirescaleError as exc:
            print(f"firescale: {what} round {k + 1} of {rounds} left out: {exc}", flush=True)
            found.append(None)
            failures.append(exc)
    if len(failures) == rounds:
        raise failures[0]
    return found


def _probe(args: argparse.Namespace, spec: NetSpec, platform: Platform, step_s: float, batch: int) -> dict:
    """Run the Horovod allreduce probe with the site's launcher: the net's gradients summed as the trainer
    sums them, inside an iteration shaped as the trainer's that takes `step_s` without the allreduce (a
    measured iteration's time less its allreduce) and is fed `batch` images per rank; its measurement.
    With --probe-overlap, also with its requests made as the step's backward pass starts (its share of the
    step, as the model counts it).  On a site with a link inside its nodes whose probe spans nodes of
    several ranks, one node's ranks are probed as well ("intra"): each link then gets a factor of its own."""
    from firescale.cluster.ranks import node_probe_ranks, probe_allreduce, site_ranks
    from firescale.model.paleo import backward_share

    site = _measuring_site(args, "--allreduce-probe")
    cost = net_cost(spec, 1)
    per_node = node_probe_ranks(site, args.allreduce_probe)
    window = step_s * backward_share(platform, spec, batch) if args.probe_overlap else 0.0

    def one(ranks: int, folder: Path, name: str) -> dict:
        out = folder / name
        probe_allreduce(site_ranks(site), ranks, spec, out, step_s=step_s, batch_per_rank=batch, overlap_s=window,
                        timeout=args.probe_timeout)
        found = allreduce_measurement(out, platform.algorithm, cost.weight_bytes)
        if not args.workdir:
            found["source"] = (f"allreduce probe on site {site.name} (firescale bench allreduce --algorithms "
                               f"horovod --gradients-of {spec.name})")
        return found

    def fastest(ranks: int, folder: Path, name: str) -> dict:
        """The probe --probe-rounds times, and the fastest: the least disturbed launch.  Over 24 sweeps
        (docs/benchmarks/2026-11-26-xeon-probe-round.md) it predicted the points' mean iteration as well as the
        rounds' median or mean did, with less bias.  A round that fails, hangs past --probe-timeout or times the
        allreduce below zero is said and left out (null in rounds_s); all failing, the first failure is the error."""
        rounds = _in_rounds(args.probe_rounds, "allreduce probe",
                            lambda k: one(ranks, folder, f"{name}-{k}.json"))   # refused below zero
        measured = [m for m in rounds if m is not None]
        return {**min(measured, key=lambda m: m["seconds"]),
                "rounds_s": [None if m is None else m["seconds"] for m in rounds]}

    with tempfile.TemporaryDirectory(prefix="firescale-probe-") as tmp:
        folder = Path(args.workdir or tmp)
        measurement = fastest(args.allreduce_probe, folder, "allreduce-probe")
        if per_node:
            measurement["intra"] = fastest(per_node, folder, "allreduce-node-probe")
    print(f"measured: Horovod allreduce of {spec.name}'s {len(cost.gradient_tensors)} gradients "
          f"({cost.weight_bytes / 1e6:.3f} MB, one group) over {measurement['ranks']} ranks after a "
          f"{step_s * 1e3:.3f} ms step: {measurement['seconds'] * 1e3:.3f} ms more than the ranks' mean step (mean; "
          f"the fastest of {_ms(measurement['rounds_s'])})"
          + (f"; requested as backward starts, {measurement['hidden_share']:.0%} of it ran beside the compute"
             if "hidden_share" in measurement else ""))
    if "intra" in measurement:
        print(f"measured: the same over one node's {per_node} ranks: {measurement['intra']['seconds'] * 1e3:.3f} ms "
              f"(the fastest of {_ms(measurement['intra']['rounds_s'])})")
    return measurement


def _ms(seconds: list[float | None]) -> str:
    return ", ".join("failed" if s is None else f"{s * 1e3:.3f}" for s in seconds) + " ms"


def _read_bandwidth(args: argparse.Namespace) -> tuple[float, dict] | None:
    """--io-record's read bandwidth and what it was read from (None without it)."""
    if args.io_format and not args.io_record:
        raise FirescaleError("--io-format picks a format of --io-record: give --io-record too")
    return read_bandwidth_measurement(args.io_record, args.io_format) if args.io_record else None


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
    io = _read_bandwidth(args)   # before anything runs or is written: a bad record stops here
    for option, rounds in (("--probe-rounds", args.probe_rounds), ("--contention-rounds", args.contention_rounds),
                           ("--short-runs", args.short_runs)):
        if rounds < 1:
            raise FirescaleError(f"{option} must be 1 or more, not {rounds}")
    for option, seconds in (("--probe-timeout", args.probe_timeout), ("--run-timeout", args.run_timeout)):
        if not seconds > 0:
            raise FirescaleError(f"{option} must be more than 0 seconds, not {seconds:g}")
    if args.allreduce_probe:     # ranks start here as the site's jobs start them: refused outside its job
        _measuring_site(args, "--allreduce-probe")
    if args.short_run and getattr(args, "site", None):   # the trainer runs here: on a site, only on its node
        _measuring_site(args, "--short-run")
    records = [read_measured_iteration(p) for p in args.record]
    measured = list(records)     # and the short run after them
    contended: list[dict] = []
    for m in measured:
        if m.ranks != 1:
            raise FirescaleError(f"{m.source}: calibration fits the compute factor from single-rank runs; "
                                 f"this one has {m.ranks} ranks")
    if args.short_run:
        if not measured:
            raise FirescaleError("--short-run repeats a recorded run: give its --record")
        batch = args.short_batch or max(1, measured[0].batch_per_rank // 2)
        with tempfile.TemporaryDirectory(prefix="firescale-calibrate-") as tmp:
            workdir = args.workdir or tmp
            shorts = [m for m in _in_rounds(args.short_runs, "short run", lambda k: short_run(
                measured[0], batch, args.short_run, workdir, timeout=args.run_timeout, repeat=k)) if m is not None]
            measured += shorts
            if args.allreduce_probe:
                contended = _contention(args, measured[0], mean_iteration(shorts), workdir)
    runs = [(m.batch_per_rank, m.iteration_s) for m in measured]
    if (args.batch is None) != (args.iteration_s is None):
        raise FirescaleError("--batch and --iteration-s go together")
    if args.batch is not None:
        runs.append((args.batch, args.iteration_s))
    if not runs:
        raise FirescaleError("give a single-rank run: --record RESULT.json, or --batch with --iteration-s")
    net = args.net or (measured[0].net if measured else None)
    if not net:
        raise FirescaleError("give --net (no run record names the network)")
    shape, classes = _net_shape(args, measured[0] if measured else None)
    spec = get_net(net, num_classes=classes, input_shape=shape)
    if args.probe_overlap and not args.allreduce_probe:
        raise FirescaleError("--probe-overlap times the allreduce probe beside its step: give --allreduce-probe too")
    if sum(bool(x) for x in (args.allreduce_json, args.comm_record, args.allreduce_probe)) > 1:
        raise FirescaleError("give one of --allreduce-json, --comm-record and --allreduce-probe")
    gradient_bytes = net_cost(spec, 1).weight_bytes
    allreduce = (allreduce_measurement(args.allreduce_json, platform.algorithm, gradient_bytes)
                 if args.allreduce_json else None)
    if args.allreduce_probe:
        # The step before each allreduce: the smallest per-rank batch measured (the mean of its runs), as the
        # most ranks run it.
        least = min((m.batch_per_rank for m in measured), default=None)
        smallest = mean_iteration([m for m in measured if m.batch_per_rank == least]) if measured else None
        step_s = smallest.iteration_s - smallest.allreduce_s if smallest else 0.0
        allreduce = _probe(args, spec, platform, step_s, smallest.batch_per_rank if smallest else 1)
    if args.comm_record:
        comm_run = read_measured_iteration(args.comm_record)
        if comm_run.net != spec.name:
            raise FirescaleError(f"{args.comm_record}: net {comm_run.net!r} is not the calibrated {spec.name!r}")
        allreduce = {**allreduce_from_run(comm_run.ranks, comm_run.allreduce_s, spec, platform.algorithm,
                                          after_step_s=comm_run.iteration_s - comm_run.allreduce_s),
                     "source": args.comm_record}
    cal = calibrate(platform, spec, runs[0][0], runs[0][1], allreduce, more_runs=runs[1:])
    cal.compute_source["records"] = [m.to_dict() for m in measured]
    if contended:
        cal = cal.with_contention(contended)
    if io is not None:
        cal = replace(cal, read_bandwidth=io[0], io_source=io[1])
    evaluated = [m for m in records if m.evaluations]   # the records' own, not the short run's
    if evaluated:
        cal = replace(cal, eval_s=sum(m.eval_s for m in evaluated) / sum(m.evaluations for m in evaluated))
    if args.out:
        out = Path(args.out)
    else:
        site = site_or_none(args)
        if site is None:
            raise FirescaleError("give --out, or --site so that the calibration goes to the site's results")
        out = site.paths.results / CALIBRATION_FILE
    save_calibration(out, cal)
    for m in measured:
        print(f"measured: {m.source}: batch {m.batch_per_rank} per rank, {m.iteration_s * 1e3:.3f} ms per iteration "
              f"(data {m.data_wait_s * 1e3:.3f}, compute {m.compute_s * 1e3:.3f}, allreduce "
              f"{m.allreduce_s * 1e3:.3f}) over {m.iterations} iterations")
    if io is not None:
        print(_describe_read(io, platform.data.read_bandwidth, inline=not platform.data.overlap_io))
    print(describe(cal.apply(platform)))
    print(f"{spec.name} {spec.input_shape}: compute percent of peak {cal.ppp_compute:.4g}, communication "
          f"{cal.ppp_comm:.4g}, fixed overhead {cal.overhead_s * 1e3:.4g} ms per iteration, "
          f"{cal.eval_s * 1e3:.4g} ms per evaluation -> {out}")
    return 0


def _describe_read(io: tuple[float, dict], site_read: float, *, inline: bool) -> str:
    """What --io-record gave, and whether predictions will use it."""
    bandwidth, source = io
    text = (f"measured: {source['source']}: raw sequential read of {source['format']} ({source['file']}) at "
            f"{bandwidth / 1e6:.4g} MB/s, stored as one node's read bandwidth")
    if site_read > 0:
        return text + f"; the site's storage.read_gbytes_per_s ({site_read / 1e9:.4g} GB/s) wins in predictions"
    if inline:
        return text + ("; note: this site's ranks read in line with their step, so the measured iterations "
                       "already hold their reading and t_io from it adds to them")
    return text
