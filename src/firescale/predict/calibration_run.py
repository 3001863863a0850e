"""A calibration run: the measurements in turn (run records, short runs, a node's contention, the allreduce probe),
the fit through them, and where it is stored (`firescale predict calibrate`)."""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from firescale.cluster.ranks import CONTENTION_ROUNDS, PROBE_ROUNDS, PROBE_TIMEOUT_S, RUN_TIMEOUT_S, SiteRanks
from firescale.cluster.site import SiteProfile
from firescale.data.manifest import manifest_if_ingested
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, PROCESS_GROUPS, REGISTRY
from firescale.frameworks import framework as framework_named
from firescale.model.layers import net_cost
from firescale.model.paleo import Platform
from firescale.nets.spec import NetSpec
from firescale.nets.zoo import get_net
from firescale.predict.calibrate import (
    Calibration,
    allreduce_from_run,
    allreduce_measurement,
    calibrate,
    read_bandwidth_measurement,
    save_calibration,
)
from firescale.predict.measurements import (
    MeasuredIteration,
    contention_medians,
    cores_for_copies,
    mean_iteration,
    node_contentions,
    read_measured_iteration,
    short_run,
    short_run_command,
)
from firescale.sweep.paths import CALIBRATION_FILE
from firescale.train.options import TrainOptions

T = TypeVar("T")
Say = Callable[[str], None]


@dataclass(frozen=True)
class CalibrationRequest:
    """What a calibration is fitted from and how its measurements run: `firescale predict calibrate`'s options
    as plain values (its --help says what each does); None is an option not given."""

    records: tuple[str, ...] = ()           # single-rank run records, or trainer result.json files
    batch: int | None = None                # a single-device run given by numbers, with iteration_s
    iteration_s: float | None = None
    net: str | None = None                  # None: the first record's
    input_shape: tuple[int, int, int] | None = None   # None: the first record's dataset manifest, else the net's
    classes: int | None = None
    short_run: int | None = None            # iterations of the first record's command again, on one rank
    short_batch: int | None = None          # None: half the first record's batch a rank
    short_runs: int = 1
    workdir: str | None = None              # None: a temporary directory
    allreduce_json: str | None = None       # one of these three fits the communication factor
    comm_record: str | None = None
    allreduce_probe: int | None = None      # ranks
    probe_rounds: int = PROBE_ROUNDS
    probe_timeout: float = PROBE_TIMEOUT_S
    probe_overlap: bool = False
    framework: str | None = None            # whose allreduce the probe times; None: the first record's backend
    process_group: str | None = None        # pytorch: the runs' process group; None: the first record's, else auto
    contention_rounds: int = CONTENTION_ROUNDS
    run_timeout: float = RUN_TIMEOUT_S
    io_record: str | None = None
    io_format: str | None = None
    out: str | None = None                  # None: the site's results folder

    def check(self) -> None:
        """The options alone, each refused by its name: the limits, the options that go together, a run to fit
        from, one communication source.  What needs the site or the files named is checked after it, and all of
        it before anything is measured (run_calibration)."""
        self.check_limits()
        if (self.batch is None) != (self.iteration_s is None):
            raise FirescaleError("--batch and --iteration-s go together")
        if self.short_run and not self.records:
            raise FirescaleError("--short-run repeats a recorded run: give its --record")
        if not self.records and self.batch is None:     # a short run repeats a record: no record, no run
            raise FirescaleError("give a single-rank run: --record RESULT.json, or --batch with --iteration-s")
        if self.probe_overlap and not self.allreduce_probe:
            raise FirescaleError("--probe-overlap times the allreduce probe beside its step: give --allreduce-probe "
                                 "too")
        if sum(bool(x) for x in (self.allreduce_json, self.comm_record, self.allreduce_probe)) > 1:
            raise FirescaleError("give one of --allreduce-json, --comm-record and --allreduce-probe")

    def check_limits(self) -> None:
        """Rounds of 1 or more and time limits above 0, each refused by its option's name."""
        for option, rounds in (("--probe-rounds", self.probe_rounds), ("--contention-rounds", self.contention_rounds),
                               ("--short-runs", self.short_runs)):
            if rounds < 1:
                raise FirescaleError(f"{option} must be 1 or more, not {rounds}")
        for option, seconds in (("--probe-timeout", self.probe_timeout), ("--run-timeout", self.run_timeout)):
            if not seconds > 0:
                raise FirescaleError(f"{option} must be more than 0 seconds, not {seconds:g}")


@dataclass(frozen=True)
class Calibrated:
    """A stored calibration, the net it was fitted for, and the file it went to."""

    calibration: Calibration
    spec: NetSpec
    out: Path

    def summary(self) -> str:
        """The fitted factors in one line, and where they went."""
        cal, spec = self.calibration, self.spec
        return (f"{spec.name} {spec.input_shape}: compute percent of peak {cal.ppp_compute:.4g}, communication "
                f"{cal.ppp_comm:.4g}, fixed overhead {cal.overhead_s * 1e3:.4g} ms per iteration, "
                f"{cal.eval_s * 1e3:.4g} ms per evaluation -> {self.out}")


def run_calibration(request: CalibrationRequest, platform: Platform, site: SiteProfile | None,
                    say: Say = print) -> Calibrated:
    """Measure what `request` asks for on `site` (or here), fit `platform`'s factors to it and store them; each
    measurement, and each round left out, is said as it comes.  The options, the site, where it goes and the
    files named (--io-record, the records, the net and its shape, --allreduce-json, --comm-record) are checked
    before anything runs; nothing is written unless all of it succeeded."""
    io = read_bandwidth(request.io_record, request.io_format)   # before anything runs: a bad record stops here
    request.check()
    out = calibration_path(request.out, site)
    _check_measuring_site(request, site)
    records = _single_rank_records(request)
    spec = _calibrated_net(request, records)     # the first record's: a short run repeats it, the same net
    framework = probe_framework(request, records)
    group = probe_process_group(request, records, framework)
    given = _given_allreduce(request, spec, platform, _expected_group(group, site))
    # From here on things run: what fails now (a short run, a round, the probe, the fit) needs what they measured.
    measured, contended = _short_runs(request, site, records, say)
    runs = _batches_and_times(request, measured)
    allreduce = (_probed_allreduce(request, spec, platform, site, measured, (framework, group), say)
                 if request.allreduce_probe else given)
    cal = calibrate(platform, spec, runs[0][0], runs[0][1], allreduce, more_runs=runs[1:])
    cal.compute_source["records"] = [m.to_dict() for m in measured]
    if contended:
        cal = cal.with_contention(contended)
    if io is not None:
        cal = replace(cal, read_bandwidth=io[0], io_source=io[1])
    evaluated = [m for m in records if m.evaluations]   # the records' own, not the short run's
    if evaluated:
        cal = replace(cal, eval_s=sum(m.eval_s for m in evaluated) / sum(m.evaluations for m in evaluated))
    save_calibration(out, cal)
    for m in measured:
        say(f"measured: {m.source}: batch {m.batch_per_rank} per rank, {m.iteration_s * 1e3:.3f} ms per iteration "
            f"(data {m.data_wait_s * 1e3:.3f}, compute {m.compute_s * 1e3:.3f}, allreduce "
            f"{m.allreduce_s * 1e3:.3f}) over {m.iterations} iterations")
    if io is not None:
        say(describe_read(io, platform.data.read_bandwidth, inline=not platform.data.overlap_io))
    return Calibrated(cal, spec, out)


def calibration_path(out: str | None, site: SiteProfile | None) -> Path:
    """Where a calibration goes: `out`, else the site's results folder."""
    if out:
        return Path(out)
    if site is None:
        raise FirescaleError("give --out, or --site so that the calibration goes to the site's results")
    return site.paths.results / CALIBRATION_FILE


def read_bandwidth(io_record: str | None, io_format: str | None) -> tuple[float, dict] | None:
    """--io-record's read bandwidth and what it was read from (None without it)."""
    if io_format and not io_record:
        raise FirescaleError("--io-format picks a format of --io-record: give --io-record too")
    return read_bandwidth_measurement(io_record, io_format) if io_record else None


def describe_read(io: tuple[float, dict], site_read: float, *, inline: bool) -> str:
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


def _single_rank_records(request: CalibrationRequest) -> list[MeasuredIteration]:
    """The records, checked to be of one rank; with --short-run, the first checked to have a command to repeat."""
    records = [read_measured_iteration(p) for p in request.records]
    for m in records:
        if m.ranks != 1:
            raise FirescaleError(f"{m.source}: calibration fits the compute factor from single-rank runs; "
                                 f"this one has {m.ranks} ranks")
    if request.short_run:    # its command built only to be refused here, not once in each round of it
        first = records[0]
        short_run_command(first.train_options(), _short_batch(request, first), request.short_run, Path("calibrate"),
                          first.batch_per_rank, first.source)
    return records


def _short_batch(request: CalibrationRequest, first: MeasuredIteration) -> int:
    return request.short_batch or max(1, first.batch_per_rank // 2)


def _short_runs(request: CalibrationRequest, site: SiteProfile | None, records: list[MeasuredIteration],
                say: Say) -> tuple[list[MeasuredIteration], list[dict]]:
    """The records and the short runs after them; with the allreduce probe and a short run, the node's
    contention."""
    if not request.short_run:
        return list(records), []
    iterations, batch = request.short_run, _short_batch(request, records[0])
    contended: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="firescale-calibrate-") as tmp:
        workdir = request.workdir or tmp
        shorts = [m for m in in_rounds(request.short_runs, "short run", lambda k: short_run(
            records[0], batch, iterations, workdir, timeout=request.run_timeout, repeat=k), say) if m is not None]
        if request.allreduce_probe:
            contended = _contention(request, site, records[0], mean_iteration(shorts), workdir, say)
    return records + shorts, contended


def _batches_and_times(request: CalibrationRequest, measured: list[MeasuredIteration]) -> list[tuple[int, float]]:
    """(batch, seconds per iteration) of each single-device run: the measured ones, then --batch's (the request
    checked that there is one)."""
    runs = [(m.batch_per_rank, m.iteration_s) for m in measured]
    if request.batch is not None and request.iteration_s is not None:
        runs.append((request.batch, request.iteration_s))
    return runs


def _calibrated_net(request: CalibrationRequest, records: list[MeasuredIteration]) -> NetSpec:
    """The net: the request's, else the first record's, in the shape `net_shape` gives it."""
    net = request.net or (records[0].net if records else None)
    if not net:
        raise FirescaleError("give --net (no run record names the network)")
    shape, classes = net_shape(request.input_shape, request.classes, records[0] if records else None)
    return get_net(net, num_classes=classes, input_shape=shape)


def net_shape(shape: tuple[int, int, int] | None, classes: int | None,
              first: MeasuredIteration | None) -> tuple[tuple[int, int, int] | None, int | None]:
    """Input shape and classes: those given, else the first record's dataset manifest and the crop its run took."""
    if first is not None and (shape is None or classes is None):
        data = manifest_if_ingested(first.dataset)
        if data is not None:
            height, width, channels = (int(v) for v in data["shape"])   # a manifest's records are HWC
            stored = (height, width, channels)
            crop = options.crop if (options := first.train_options()) else None
            shape = shape or ((crop, crop, stored[2]) if crop else stored)
            classes = classes or int(data["num_classes"])
    return shape, classes


def _first_options(records: list[MeasuredIteration]) -> TrainOptions | None:
    """The options the first record's run trained with; None without a record, or a record without them."""
    return records[0].train_options() if records else None


def probe_framework(request: CalibrationRequest, records: list[MeasuredIteration]) -> str:
    """The backend whose trainer's allreduce --allreduce-probe times: --framework, else the first record's
    (its run's --framework, else the trainer's default); checked before anything runs, --probe-overlap
    with it too."""
    recorded = first.framework if (first := _first_options(records)) else None
    where = f"{records[0].source}: --framework" if recorded and not request.framework else "--framework"
    chosen = framework_named(request.framework or recorded or DEFAULT_FRAMEWORK, where)
    if request.allreduce_probe and request.probe_overlap and not chosen.probe_overlap:
        overlapping = " or ".join(f"{f.library}'s" for f in REGISTRY.values() if f.probe_overlap)
        raise FirescaleError(f"--probe-overlap times {overlapping} allreduce beside the step's backward pass; the "
                             f"{chosen.name} trainer's ({chosen.library}'s) is probed on its own: leave "
                             "--probe-overlap out")
    return chosen.name


def probe_process_group(request: CalibrationRequest, records: list[MeasuredIteration], framework: str) -> str | None:
    """The process group a pytorch calibration's runs sum over, as they ask for it: --process-group, else the first
    record's command's, else auto (None for tensorflow: Horovod's ranks); checked before anything runs."""
    chosen = REGISTRY[framework]
    if not chosen.names_process_group:
        if request.process_group not in (None, "auto"):
            naming = " or ".join(f.name for f in REGISTRY.values() if f.names_process_group)
            raise FirescaleError(f"--process-group {request.process_group} is the {naming} trainer's; the "
                                 f"{framework} trainer sums over {chosen.library}")
        return None
    recorded = first.process_group if (first := _first_options(records)) else None
    group = request.process_group or recorded or "auto"
    if group not in PROCESS_GROUPS:
        where = "--process-group" if request.process_group else f"{records[0].source}: --process-group"
        raise FirescaleError(f"{where} {group!r} is not a process group; known: {', '.join(PROCESS_GROUPS)}")
    return group


def _expected_group(group: str | None, site: SiteProfile | None) -> str | None:
    """The process group the runs resolve `group` to (model.paleo.site_process_group), where it can be known:
    a named one, or auto on a site; None otherwise."""
    from firescale.model.paleo import site_process_group

    if group is None or (group == "auto" and site is None):
        return None
    return site_process_group(site, group) if site is not None else group


def _given_allreduce(request: CalibrationRequest, spec: NetSpec, platform: Platform,
                     process_group: str | None = None) -> dict[str, Any] | None:
    """The allreduce measurement read from --allreduce-json (torch's over `process_group`, the one the runs use)
    or --comm-record (None without them): read, and refused, before anything runs."""
    if request.allreduce_json:
        return allreduce_measurement(request.allreduce_json, platform.algorithm, net_cost(spec, 1).weight_bytes,
                                     process_group)
    if not request.comm_record:
        return None
    comm_run = read_measured_iteration(request.comm_record)
    if comm_run.net != spec.name:
        raise FirescaleError(f"{request.comm_record}: net {comm_run.net!r} is not the calibrated {spec.name!r}")
    return {**allreduce_from_run(comm_run.ranks, comm_run.allreduce_s, spec, platform.algorithm,
                                 after_step_s=comm_run.iteration_s - comm_run.allreduce_s),
            "source": request.comm_record}


def _probed_allreduce(request: CalibrationRequest, spec: NetSpec, platform: Platform, site: SiteProfile | None,
                      measured: list[MeasuredIteration], trainer: tuple[str, str | None], say: Say) -> dict[str, Any]:
    """The allreduce probe's measurement, after the step before each allreduce: the smallest per-rank batch
    measured (the mean of its runs), as the most ranks run it."""
    least = min((m.batch_per_rank for m in measured), default=None)
    smallest = mean_iteration([m for m in measured if m.batch_per_rank == least]) if measured else None
    step_s = smallest.iteration_s - smallest.allreduce_s if smallest else 0.0
    return _probe(request, site, spec, platform, step_s, smallest.batch_per_rank if smallest else 1, trainer, say)


def _check_measuring_site(request: CalibrationRequest, site: SiteProfile | None) -> None:
    """What the request measures checked against the site, before anything runs: ranks start only where the
    site's jobs start them, and the contention's copies, when they run here, get a core each."""
    if request.allreduce_probe:     # ranks start here as the site's jobs start them: refused outside its job
        measuring_site(site, "--allreduce-probe")
    if request.short_run and site is not None:   # the trainer runs here: on a site, only on its node
        measuring_site(site, "--short-run")
    if request.short_run and request.allreduce_probe:
        copies, node, nodes = _node_copies(request, measuring_site(site, "--allreduce-probe"))
        if nodes and node is None:
            cores_for_copies(copies)


def measuring_site(site: SiteProfile | None, what: str) -> SiteProfile:
    """The site whose ranks a measurement starts as its jobs start them: a site without a scheduler here, a
    site with one only from inside one of its jobs (where its launcher places ranks on the job's nodes)."""
    from firescale.jobs.schedulers import get_scheduler

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


def in_rounds(rounds: int, what: str, measure: Callable[[int], T], say: Say = print) -> list[T | None]:
    """measure(k) for each of `rounds` rounds, in turn: a round that fails (a FirescaleError: it failed, ran
    out of its time limit or measured nonsense) is said in one line and left out (None in its place); all
    failing, the first failure is the error."""
    found: list[T | None] = []
    failures: list[FirescaleError] = []
    for k in range(rounds):
        try:
            found.append(measure(k))
        except FirescaleError as exc:
            say(f"firescale: {what} round {k + 1} of {rounds} left out: {exc}")
            found.append(None)
            failures.append(exc)
    if len(failures) == rounds:
        raise failures[0]
    return found


def _contention(request: CalibrationRequest, site: SiteProfile | None, baseline: MeasuredIteration,
                alone: MeasuredIteration, workdir: str, say: Say) -> list[dict]:
    """The short run again once for each rank the probe's point puts on a node, all at once: the node's
    contention (none when it puts one a node).  On a Slurm site the copies are one job step on one node, and
    when the probe spans several nodes, a second step runs as many on each of them at once (what a point's
    nodes share, beside what a node's ranks share); elsewhere they run here, each on a core of its own (in
    a job, here is the job's first node).  --contention-rounds rounds, each in a folder of its own; a round
    that fails or runs out of --run-timeout is said and left out (all failing, the first failure is the
    error); the median factor of each node count."""
    copies, node, nodes = _node_copies(request, measuring_site(site, "--allreduce-probe"))
    if not nodes:
        return []
    iterations = request.short_run or 0

    def one(k: int) -> list[dict]:
        folder = Path(workdir) / f"contention-round-{k}"
        folder.mkdir(parents=True, exist_ok=True)
        found = node_contentions(alone, baseline, copies, iterations, folder, node=node, nodes=nodes,
                                 timeout=request.run_timeout)
        for c in found:
            where = "" if node is None else " on one node" if c["nodes"] == 1 else f" on each of {c['nodes']} nodes"
            below = "" if c["ratio"] >= 1 else ", taken as 1: the one alone was the disturbed run"
            say(f"measured: round {k + 1}: {c['copies']} copies of the short run at once{where} compute "
                f"{c['ratio']:.3f} times as long as one alone ({c['alone_s'] * 1e3:.3f} ms){below}")
        return found

    # a round goes whole: each has every node count or none
    measured = [c for found in in_rounds(request.contention_rounds, "contention", one, say) if found for c in found]
    medians = contention_medians(measured)
    for c in medians:
        say(f"measured: contention {c['factor']:.3f} on {c['nodes']} node(s), the median of "
            f"{len(c['rounds'])} round(s)")
    return medians


def _node_copies(request: CalibrationRequest, site: SiteProfile) -> tuple[int, SiteRanks | None, list[int]]:
    """The contention's copies of the short run on a node, beside the probe's ranks: how many, the job step they
    run as (None: here, each on a core of its own) and the node counts of each round (none: a node holds one)."""
    from firescale.cluster.ranks import contention_nodes, copies_step, site_ranks

    probe = request.allreduce_probe or 0
    return site_ranks(site).on_a_node(probe), copies_step(site), contention_nodes(site, probe)


def _probe(request: CalibrationRequest, site: SiteProfile | None, spec: NetSpec, platform: Platform, step_s: float,
           batch: int, trainer: tuple[str, str | None], say: Say) -> dict:
    """Run the allreduce probe of the trainer (its framework, and for pytorch the process group its runs ask for)
    with the site's launcher (cluster/ranks.probe_allreduce): the net's gradients summed as the trainer sums them;
    Horovod's inside an iteration shaped as the trainer's that takes `step_s` without the allreduce (a measured
    iteration's time less its allreduce) and is fed `batch` images per rank, torch's on its own, over the group the
    probe's ranks resolve as the runs' do, and fitted to that group's model; its measurement.
    With --probe-overlap, also with its requests made as the step's backward pass starts (its share of the
    step, as the model counts it).  On a site with a link inside its nodes whose probe spans nodes of
    several ranks, one node's ranks are probed as well ("intra"): each link then gets a factor of its own."""
    from firescale.cluster.ranks import node_probe_ranks, probe_allreduce, site_ranks
    from firescale.model.paleo import backward_share

    site = measuring_site(site, "--allreduce-probe")
    framework, group = trainer
    probe_ranks = request.allreduce_probe or 0
    cost = net_cost(spec, 1)
    per_node = node_probe_ranks(site, probe_ranks)
    window = step_s * backward_share(platform, spec, batch) if request.probe_overlap else 0.0

    def one(ranks: int, folder: Path, name: str) -> dict:
        out = folder / name
        probe_allreduce(site_ranks(site), ranks, spec, out, step_s=step_s, batch_per_rank=batch, overlap_s=window,
                        timeout=request.probe_timeout, framework=framework, process_group=group or "auto")
        found = allreduce_measurement(str(out), platform.algorithm, cost.weight_bytes)
        if not request.workdir:
            found["source"] = (f"allreduce probe on site {site.name} (firescale bench allreduce --framework "
                               f"{framework} --gradients-of {spec.name})")
        return found

    def fastest(ranks: int, folder: Path, name: str) -> dict:
        """The probe --probe-rounds times, and the fastest: the least disturbed launch.  Over 24 sweeps
        (docs/benchmarks/2026-11-26-xeon-probe-round.md) it predicted the points' mean iteration as well as the
        rounds' median or mean did, with less bias.  A round that fails, hangs past --probe-timeout or times the
        allreduce below zero is said and left out (null in rounds_s); all failing, the first failure is the error."""
        rounds = in_rounds(request.probe_rounds, "allreduce probe",
                           lambda k: one(ranks, folder, f"{name}-{k}.json"), say)   # refused below zero
        measured = [m for m in rounds if m is not None]
        return {**min(measured, key=lambda m: m["seconds"]),
                "rounds_s": [None if m is None else m["seconds"] for m in rounds]}

    with tempfile.TemporaryDirectory(prefix="firescale-probe-") as tmp:
        folder = Path(request.workdir or tmp)
        measurement = fastest(probe_ranks, folder, "allreduce-probe")
        if per_node:
            measurement["intra"] = fastest(per_node, folder, "allreduce-node-probe")
    seconds = f"{measurement['seconds'] * 1e3:.3f} ms"
    if REGISTRY[framework].negotiation_cycle:     # the mean wait for its cycle (Horovod's) is in it
        timed = f"after a {step_s * 1e3:.3f} ms step: {seconds} more than the ranks' mean step (mean"
    else:
        timed = f"on its own: {seconds} (median"
    who = (f"the {framework} trainer's ({measurement['process_group']} process group)"
           if measurement.get("process_group") else REGISTRY[framework].library)
    say(f"measured: {who} allreduce of {spec.name}'s {len(cost.gradient_tensors)} gradients "
        f"({cost.weight_bytes / 1e6:.3f} MB, one group) over {measurement['ranks']} ranks {timed}; "
        f"the fastest of {_ms(measurement['rounds_s'])})"
        + (f"; requested as backward starts, {measurement['hidden_share']:.0%} of it ran beside the compute"
           if "hidden_share" in measurement else ""))
    if "intra" in measurement:
        say(f"measured: the same over one node's {per_node} ranks: {measurement['intra']['seconds'] * 1e3:.3f} ms "
            f"(the fastest of {_ms(measurement['intra']['rounds_s'])})")
    return measurement


def _ms(seconds: list[float | None]) -> str:
    return ", ".join("failed" if s is None else f"{s * 1e3:.3f}" for s in seconds) + " ms"
