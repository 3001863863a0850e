"""The sweep points of an experiment on a site (GPUs, batch, learning rate, repeat) and the site's limits."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firescale.cluster.site import SiteProfile, parse_walltime
from firescale.errors import FirescaleError
from firescale.sweep.paths import resolve

LOCAL_REPEATS = 3      # runs per point on a site without a scheduler: enough for a mean ± sd and an interval
CLUSTER_REPEATS = 1    # on a cluster one run per point, unless the experiment asks for more
# A point's name: the baseline ("baseline", its repeats "baseline-r1", ...), or GPUs, total batch (a
# batch schedule adds each change, "+32at600": total batch 32 from iteration 600), the devices of each
# replica when a layer plan splits it ("-d2"), the learning rate when the experiment sweeps it, and the
# repeat.  The run folder and records carry it.
POINT_NAME = re.compile(r"^(?:baseline(?:-r(?P<brepeat>[1-9]\d*))?"
                        r"|g(?P<gpus>\d+)-b(?P<batch>\d+)(?P<schedule>(?:\+\d+at\d+)+)?(?:-d(?P<devices>\d+))?"
                        r"(?:-lr(?P<lr>[0-9][0-9.e+-]*?))?-r(?P<repeat>\d+))$")
POINT_WILDCARD = r"baseline(-r[1-9]\d*)?|g\d+-b\d+(\+\d+at\d+)*(-d\d+)?(-lr[0-9][0-9.e+-]*?)?-r\d+"
_CHANGE = re.compile(r"\+(\d+)at(\d+)")
# A site's override of any of these gives the site its own grid: the sweep's explicit `points` are left out
# unless the override lists its own.
GRID_KEYS = ("gpus", "batch", "batch_schedules")


def lr_label(lr: float) -> str:
    """A learning rate as point names write it: 0.08, 1e-05."""
    return f"{lr:g}"


def schedule_from_name(name: str) -> tuple[tuple[int, int], ...]:
    """The batch changes a point name carries, (iteration, total batch) each; () for a point without."""
    m = POINT_NAME.match(name)
    text = (m["schedule"] or "") if m else ""
    return tuple((int(it), int(batch)) for batch, it in _CHANGE.findall(text))


def batch_label(name: str, batch: int) -> str:
    """The batch as the report's table writes it: '64', or a schedule's batches in turn, '16+32'."""
    return "+".join(str(b) for b in (batch, *(b for _, b in schedule_from_name(name))))


@dataclass(frozen=True)
class SweepPoint:
    """One training run of a sweep: GPUs, total batch, initial learning rate, repeat, and its epochs
    when the experiment states them (None: the solver's max_iter at the baseline batch defines them)."""

    experiment: str
    gpus: int
    batch: int
    lr: float
    repeat: int
    baseline: bool = False
    epochs: float | None = None
    lr_in_name: bool = False    # the experiment sweeps the learning rate: the name says which
    schedule: tuple[tuple[int, int], ...] = ()  # batch changes (iteration, total batch); `batch` is the first
    layer_plan: str = ""        # a file with a `dist` plan splitting each replica over `devices` GPUs
    devices: int = 1            # GPUs per replica (rank): the layer plan's devices

    @property
    def group(self) -> str:
        """The name shared by the repeats of one point: 'baseline', 'g2-b128', 'g32-b1024-lr0.08' or,
        with a batch schedule, 'g2-b16+32at600'."""
        if self.baseline:
            return "baseline"
        changes = "".join(f"+{batch}at{iteration}" for iteration, batch in self.schedule)
        split = f"-d{self.devices}" if self.layer_plan else ""
        return f"g{self.gpus}-b{self.batch}{changes}{split}" + (f"-lr{lr_label(self.lr)}" if self.lr_in_name else "")

    @property
    def name(self) -> str:
        if self.baseline:
            return "baseline" if self.repeat == 0 else f"baseline-r{self.repeat}"
        return f"{self.group}-r{self.repeat}"

    @property
    def batch_per_gpu(self) -> int:
        """Images per replica (per GPU, or per group of `devices` GPUs when a layer plan splits the net)."""
        return self.batch // self.ranks

    @property
    def ranks(self) -> int:
        """Horovod ranks: one per replica, each driving `devices` GPUs."""
        return self.gpus // self.devices

    @property
    def phases(self) -> list[tuple[int, int]]:
        """(first iteration, total batch) of each batch phase: one phase from 0 without a schedule."""
        return [(0, self.batch), *self.schedule]

    @property
    def peak_batch_per_gpu(self) -> int:
        """The largest batch per GPU of its phases: what its memory must hold."""
        return max(batch for _, batch in self.phases) // self.ranks

    def schedule_option(self) -> str:
        """The schedule as `firescale train --batch-schedule` takes it: '600:32,900:64' ('' without)."""
        return ",".join(f"{iteration}:{batch}" for iteration, batch in self.schedule)


def phase_images(point: SweepPoint, images: float) -> list[tuple[int, float]]:
    """(total batch, images) each phase of `point` trains when the whole run trains `images`: every
    phase runs to the next change, the last one to the end; a phase the budget never reaches gets 0."""
    out = []
    phases = point.phases
    for k, (start, batch) in enumerate(phases):
        span = (phases[k + 1][0] - start) * batch if k + 1 < len(phases) else images
        out.append((batch, min(span, images)))
        images -= out[-1][1]
    return out


def _scaled_lr(base_lr: float, rule: str, batch: int, baseline_batch: int) -> float:
    ratio = batch / baseline_batch
    return {"none": base_lr, "linear": base_lr * ratio, "sqrt": base_lr * math.sqrt(ratio)}[rule]


@dataclass(frozen=True)
class _Candidate:
    gpus: int
    batch: int
    lr: float | None        # None: the lr_scaling rule's
    epochs: float | None
    key: str                # where in the experiment it was written, for errors
    schedule: tuple[tuple[int, int], ...] = ()   # batch changes (iteration, total batch) after `batch`
    layer_plan: str = ""
    devices: int = 1


class _Experiment:
    """One experiment's settings on one site, each read with the key it came from."""

    def __init__(self, config: dict[str, Any], name: str, site: str, base: Path) -> None:
        self.name, self.exp, self.base = name, config["experiments"][name], base
        self.site_keys = self.exp["sites"].get(site) or {}
        self.sweep = {**self.exp["sweep"], **self.site_keys}
        if any(k in self.site_keys for k in GRID_KEYS) and "points" not in self.site_keys:
            self.sweep.pop("points", None)   # the site's own grid: the points written for another scale go
        self.site = site

    def key(self, key: str) -> str:
        return f"sites.{self.site}.{key}" if key in self.site_keys else f"sweep.{key}"

    def error(self, key: str, message: str) -> FirescaleError:
        return FirescaleError(f"experiment {self.name}: key '{key}' {message}")

    def epochs(self, value: Any, key: str) -> float | None:
        if value is not None and not value > 0:
            raise self.error(key, f"is {value}; epochs must be positive")
        return value

    def lr(self, value: Any, key: str) -> float | None:
        if value is not None and not value > 0:
            raise self.error(key, f"is {value}; a learning rate must be positive")
        return value

    def schedule(self, phases: list[dict[str, int]], key: str) -> tuple[int, tuple[tuple[int, int], ...]]:
        """A batch schedule's first batch and its changes; the first phase at iteration 0, the iterations
        increasing, and each phase at another batch than the one before."""
        if len(phases) < 2:
            raise self.error(key, f"lists {len(phases)} phase(s); a batch schedule needs its first phase (at "
                                  f"iteration 0) and at least one change of batch")
        if phases[0]["iteration"] != 0:
            raise self.error(f"{key}[0].iteration", f"is {phases[0]['iteration']}; a batch schedule's first "
                                                    f"phase starts at iteration 0")
        for k in range(1, len(phases)):
            before, now = phases[k - 1], phases[k]
            if now["iteration"] <= before["iteration"]:
                raise self.error(f"{key}[{k}].iteration", f"is {now['iteration']}, not after the phase before "
                                 f"({before['iteration']}); list the phases by increasing iteration")
            if now["batch"] == before["batch"]:
                raise self.error(f"{key}[{k}].batch", f"is {now['batch']}, the batch of the phase before; "
                                 f"each phase of a batch schedule changes the batch")
        return phases[0]["batch"], tuple((p["iteration"], p["batch"]) for p in phases[1:])

    def layer_plan(self, path: str, key: str, gpus: int) -> int:
        """The devices per replica of the layer plan in `path`, checked against the experiment's net
        (every arch's layers) and the point's GPUs (whole replicas)."""
        from firescale.nets.device_plan import arch_devices, read_layer_plan
        from firescale.nets.zoo import get_net
        from firescale.sweep.net_file import experiment_net

        try:
            plan = read_layer_plan(resolve(path, self.base))
        except FirescaleError as exc:
            raise self.error(key, f"is {path!r}, which cannot be read ({exc})") from None
        if plan is None:
            raise self.error(key, f"is {path!r}, which has no dist plan; give a solver file (.prototxt) with "
                                  f"dist blocks or a YAML file with a dist key")
        spec = get_net(experiment_net(self.exp["net"], self.base))
        for which, arches in (("train", plan.train), ("test", plan.test)):
            for k, arch in enumerate(arches):
                arch_devices(arch, spec, f"experiment {self.name}: key '{key}': {plan.source}: dist ({which}) arch {k}")
        if gpus % plan.devices:
            raise self.error(key, f"splits each replica over {plan.devices} devices, which does not divide the "
                                  f"point's {gpus} GPUs; give a multiple of {plan.devices} GPUs")
        return plan.devices


def _candidates(e: _Experiment) -> list[_Candidate]:
    """The gpus x batch (x lr) grid, its batch schedules and the explicit points, each total batch resolved."""
    mode, baseline_batch = e.exp["batch"]["mode"], e.exp["batch"]["baseline"]
    total = lambda replicas, batch: batch if mode == "total" else batch * replicas  # noqa: E731
    default_epochs = e.epochs(e.exp.get("epochs"), "epochs")
    sweep_epochs = e.epochs(e.sweep.get("epochs"), e.key("epochs"))
    epochs = sweep_epochs if sweep_epochs is not None else default_epochs
    rates = e.sweep.get("lr") or [None]
    for i, lr in enumerate(rates):
        e.lr(lr, f"{e.key('lr')}[{i}]")
        if lr is not None and rates.index(lr) != i:
            raise e.error(e.key("lr"), f"lists {lr:g} twice; list each learning rate once")
    batches = e.sweep.get("batch", [] if e.sweep.get("batch_schedules") else [baseline_batch])
    out = [_Candidate(g, total(g, b), lr, epochs, e.key("batch"))
           for g in e.sweep.get("gpus", []) for b in batches for lr in rates]
    schedules = [(f"{e.key('batch_schedules')}[{k}]", e.schedule(phases, f"{e.key('batch_schedules')}[{k}]"))
                 for k, phases in enumerate(e.sweep.get("batch_schedules", []))]
    out += [_Candidate(g, total(g, first), lr, epochs, key, tuple((i, total(g, b)) for i, b in changes))
            for g in e.sweep.get("gpus", []) for key, (first, changes) in schedules for lr in rates]
    out += [_explicit(e, f"{e.key('points')}[{i}]", p, total, epochs) for i, p in enumerate(e.sweep.get("points", []))]
    for c in out:
        replicas = c.gpus // c.devices
        on, unit = (f"{c.gpus} GPUs", "GPUs") if c.devices == 1 else (f"{replicas} replicas ({c.devices} GPUs each)",
                                                                       "replicas")
        for batch in (c.batch, *(b for _, b in c.schedule)):
            if batch % replicas:
                raise e.error(c.key, f"asks for a total batch of {batch} on {on}, which does not divide evenly; "
                                     f"use a total batch that is a multiple of the {unit}")
    return out


def _explicit(e: _Experiment, key: str, p: dict[str, Any], total: Any, epochs: float | None) -> _Candidate:
    """One of the sweep's explicit points: its batch or batch schedule, rate, epochs and layer plan."""
    point_epochs = e.epochs(p.get("epochs"), f"{key}.epochs")
    if ("batch" in p) == ("batch_schedule" in p):
        raise e.error(key, "needs one of 'batch' and 'batch_schedule', not both or neither")
    first, changes = (p["batch"], ()) if "batch" in p else e.schedule(p["batch_schedule"], f"{key}.batch_schedule")
    plan = p.get("layer_plan", "")
    devices = e.layer_plan(plan, f"{key}.layer_plan", p["gpus"]) if plan else 1
    replicas = p["gpus"] // devices   # per_gpu batches are per replica when a plan splits it
    return _Candidate(p["gpus"], total(replicas, first), e.lr(p.get("lr"), f"{key}.lr"),
                      point_epochs if point_epochs is not None else epochs,
                      f"{key}.batch" if "batch" in p else f"{key}.batch_schedule",
                      tuple((i, total(replicas, b)) for i, b in changes), plan, devices)


def plan_sweep(config: dict[str, Any], experiment: str, site: str, base_lr: float,
               default_repeats: int = CLUSTER_REPEATS, *, base: Path) -> list[SweepPoint]:
    """The baseline and every sweep point of `experiment` on `site`, each repeated, in a stable order.

    The same point listed twice (in the grid and as an explicit point) is one point; the grid's
    1-GPU point at the baseline batch and rate is the baseline itself.  Layer plans are read from `base`
    (the project folder) when relative.
    """
    e = _Experiment(config, experiment, site, base)
    baseline_batch, rule = e.exp["batch"]["baseline"], e.exp["lr_scaling"]
    repeats = e.sweep.get("repeats") or e.exp.get("repeats") or default_repeats
    baseline_epochs = e.epochs(e.exp.get("epochs"), "epochs")
    seen: set[tuple[Any, ...]] = {(1, baseline_batch, (), "", base_lr, baseline_epochs)}
    unique: list[tuple[Any, ...]] = []
    for c in _candidates(e):
        # a schedule's first phase takes the rule's rate; the trainer scales each later phase from it
        lr = c.lr if c.lr is not None else _scaled_lr(base_lr, rule, c.batch, baseline_batch)
        shape = (c.gpus, c.batch, c.schedule, c.layer_plan, lr, c.epochs)
        if shape not in seen:
            seen.add(shape)
            unique.append((*shape, c.devices))
    rates_per_shape: dict[tuple[Any, ...], set[float]] = {}
    for shape in unique:
        rates_per_shape.setdefault(shape[:4], set()).add(shape[4])
    lr_in_name = bool(e.sweep.get("lr")) or any(len(r) > 1 for r in rates_per_shape.values())
    points = [SweepPoint(experiment, 1, baseline_batch, base_lr, r, baseline=True, epochs=baseline_epochs)
              for r in range(repeats)]
    for gpus, batch, schedule, plan, lr, epochs, devices in unique:
        points += [SweepPoint(experiment, gpus, batch, lr, r, epochs=epochs, lr_in_name=lr_in_name, schedule=schedule,
                              layer_plan=plan, devices=devices) for r in range(repeats)]
    names = [p.name for p in points]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash:
        raise e.error(e.key("points"), f"plans point {clash} twice with different epochs or layer plans; give "
                                       f"each point of the same GPUs, batch and rate one number of epochs and "
                                       f"one layer plan")
    return points


def sweep_walltime(config: dict[str, Any], experiment: str, site: SiteProfile) -> str:
    """The walltime of the site's override, else the sweep's, the experiment's, the site's default_walltime."""
    exp = config["experiments"][experiment]
    return ((exp["sites"].get(site.name) or {}).get("walltime") or exp["sweep"].get("walltime")
            or exp.get("walltime") or site.default_walltime)


def limit_errors(points: list[SweepPoint], site: SiteProfile, walltime: str) -> list[str]:
    """Each point that asks for more nodes, or longer, than the site allows, named with the limit."""
    errors = []
    wall = parse_walltime(walltime, where="walltime")
    if wall > site.max_walltime_s:
        errors.append(f"walltime {walltime} exceeds site {site.name}'s limits.max_walltime "
                      f"{site.config['limits']['max_walltime']}")
    lead = site.walltime_signal()[1]
    if site.scheduler != "local" and wall <= lead:
        errors.append(f"walltime {walltime} is not longer than site {site.name}'s walltime_signal.seconds_before "
                      f"({lead} s): every job would be told to snapshot and stop as soon as it starts")
    for p in points:
        try:
            nodes = site.nodes_for(p.ranks, p.devices)
        except FirescaleError as exc:
            errors.append(f"point {p.experiment}/{p.name} splits each replica over {p.devices} GPUs: {exc}")
            continue
        if nodes > site.max_nodes:
            errors.append(
                f"point {p.experiment}/{p.name} needs {nodes} nodes ({p.gpus} GPUs at {site.gpus_per_node} per node); "
                f"site {site.name} allows limits.max_nodes {site.max_nodes}"
            )
    return errors


def solver_base_lr(config: dict[str, Any], experiment: str, base: Path) -> float:
    """The base learning rate of the experiment's solver file (YAML or solver.prototxt), read from `base`
    (the project folder) when relative."""
    from firescale.caffe.solver import load_solver  # the trainer's parser: one vocabulary

    return float(load_solver(resolve(config["experiments"][experiment]["solver"], base)).base_lr)
