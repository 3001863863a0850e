"""The SweepPlan: a site, its experiments' points and walltimes; built once, handed on."""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firescale.caffe.solver import SolverConfig, load_solver
from firescale.cluster.ranks import (
    CONTENTION_ROUNDS,
    PROBE_ROUNDS,
    PROBE_TIMEOUT_S,
    RUN_TIMEOUT_S,
    contention_nodes,
    node_probe_ranks,
    timeout_within,
)
from firescale.cluster.site import SiteProfile, load_site, parse_walltime
from firescale.data.manifest import MANIFEST, manifest_if_ingested
from firescale.errors import FirescaleError
from firescale.frameworks import REGISTRY, check_combination
from firescale.sweep.budget import KNOWN_TRAIN_IMAGES, Budget, point_budget
from firescale.sweep.config import experiments_for, load_config, validate_config
from firescale.sweep.net_file import check_experiment_mean, check_experiment_net, experiment_net
from firescale.sweep.paths import config_file, portable, project_folder, resolve
from firescale.sweep.points import (
    CLUSTER_REPEATS,
    LOCAL_REPEATS,
    SweepPoint,
    limit_errors,
    plan_sweep,
    solver_base_lr,
    sweep_walltime,
)
from firescale.yamlfile import load_yaml


@dataclass(frozen=True)
class SweepPlan:
    """The site and, per experiment, its sweep points, walltime and any point over the site's limits.

    The Snakefile, `site render`, `site lint`, `report` and `predict experiment` all build this one
    object and read the points from it; none plans a sweep by hand."""

    site: SiteProfile
    points: dict[str, list[SweepPoint]]
    config: dict[str, Any]
    walltimes: dict[str, str]
    limit_problems: dict[str, list[str]]
    source: str = "workflow/config.yaml"
    base: Path = Path(".")   # the project folder: relative solver and layer_plan paths are read from it

    @classmethod
    def build(cls, config: dict[str, Any], site: SiteProfile | None = None, *, experiments: list[str] | None = None,
              source: str | Path = "workflow/config.yaml", check_limits: bool = True,
              files: Sequence[str] = (), base: str | Path | None = None) -> SweepPlan:
        """Plan `experiments` (default: every experiment that lists the site) on `site` (default: the
        config's `site`).  With `check_limits`, a point over the site's limits stops here.  `files`
        (Snakemake's config files) are read again, strictly, so that a key given twice there is refused
        (Snakemake's loader keeps the last one silently).  Relative paths in the config are read from
        `base` (default: the project folder, `sweep.paths.project_folder`; the workflow passes its own folder)."""
        for path in files:
            load_yaml(path, "experiments file")
        config = validate_config(config, source)
        base = Path(base).resolve() if base else project_folder(source)
        site = site or load_site(config["site"])
        if experiments is None:
            experiments = experiments_for(config, site.name)
            if not experiments:
                raise FirescaleError(f"{source}: no experiment lists site {site.name!r} under its 'sites'")
        for experiment in experiments:
            if experiment not in config["experiments"]:
                raise FirescaleError(f"{source}: no experiment {experiment!r}; known: "
                                     f"{', '.join(sorted(config['experiments']))}")
        points: dict[str, list[SweepPoint]] = {}
        walltimes: dict[str, str] = {}
        problems: dict[str, list[str]] = {}
        for experiment in experiments:
            exp = config["experiments"][experiment]
            check_experiment_net(experiment, exp, base, _dataset_dir(site, exp), str(source))
            check_experiment_mean(experiment, exp, base, str(source))
            check_combination(exp["framework"], exp["precision"], exp.get("process_group", "auto"),
                              where=f"{source}: experiment {experiment}: ")
            repeats = LOCAL_REPEATS if site.scheduler == "local" else CLUSTER_REPEATS
            try:
                base_lr = solver_base_lr(config, experiment, base)
            except FirescaleError as exc:   # the solver's own words, and which file and experiment name it
                raise FirescaleError(f"{source}: experiment {experiment}: key 'solver': {exc}") from None
            points[experiment] = plan_sweep(config, experiment, site.name, base_lr, repeats, base=base)
            walltimes[experiment] = sweep_walltime(config, experiment, site)
            problems[experiment] = limit_errors(points[experiment], site, walltimes[experiment])
            if check_limits and problems[experiment]:
                raise FirescaleError("; ".join(problems[experiment]))
        plan = cls(site=site, points=points, config=config, walltimes=walltimes, limit_problems=problems,
                   source=str(source), base=base)
        plan.check_schedules()
        return plan

    def check_schedules(self) -> None:
        """Every batch schedule's changes fall inside its point's budget (where the budget is known before
        ingest: the solver's max_iter, or a dataset whose size is known)."""
        for experiment, points in self.points.items():
            for point in points:
                if point.schedule and (point.epochs is None or self.train_images(experiment)[0] is not None):
                    self.budget(experiment, point)

    def resolve(self, path: str | Path) -> Path:
        """A path of the experiments file (solver, layer_plan): as given when absolute, else in the project."""
        return resolve(path, self.base)

    def experiment(self, name: str) -> dict[str, Any]:
        """The experiment's settings, defaults filled in."""
        return self.config["experiments"][name]

    def point(self, experiment: str, name: str) -> SweepPoint:
        """The planned point called `name`; an unknown name lists the known ones."""
        for point in self.points[experiment]:
            if point.name == name:
                return point
        raise FirescaleError(f"experiment {experiment}: no sweep point {name!r}; "
                             f"points: {', '.join(self.point_names(experiment))}")

    def baselines(self, experiment: str) -> list[SweepPoint]:
        """The baseline's repeats ('baseline', 'baseline-r1', ...)."""
        return [p for p in self.points[experiment] if p.baseline]

    def lr_search(self, experiment: str) -> list[SweepPoint]:
        """The points of the experiment's learning-rate searches: those whose GPUs and batch it trains at
        more than one rate (empty when it searches none)."""
        rates: dict[tuple[Any, ...], set[float]] = {}
        for p in self.points[experiment]:
            if not p.baseline:
                rates.setdefault((p.gpus, p.batch, p.schedule, p.layer_plan), set()).add(p.lr)
        return [p for p in self.points[experiment]
                if not p.baseline and len(rates[p.gpus, p.batch, p.schedule, p.layer_plan]) > 1]

    def run_option(self, experiment: str, key: str) -> Any:
        """A sweep key that sets how the experiment's runs train on this site: the site's `sites.<site>.KEY`,
        else the sweep's, else None."""
        exp = self.experiment(experiment)
        return {**exp["sweep"], **(exp["sites"].get(self.site.name) or {})}.get(key)

    def framework(self, experiment: str) -> str:
        """The backend the experiment's runs train with (tensorflow, pytorch): whose allreduce they pay."""
        return str(self.experiment(experiment)["framework"])

    def calibrates(self, experiment: str) -> bool:
        """Whether the experiment's predictions for the report are calibrated on the site (its `calibrate`; false:
        no calibration job, the uncalibrated model's predictions, marked so)."""
        return bool(self.experiment(experiment)["calibrate"])

    def overlap_allreduce(self, experiment: str) -> bool:
        """Whether the experiment's runs on this site overlap each gradient's allreduce with the backward pass."""
        return bool(self.run_option(experiment, "overlap_allreduce"))

    def read_limit_mbs(self, experiment: str) -> float | None:
        """The MB/s each rank of the experiment's runs on this site reads at most (None: as fast as it can)."""
        limit = self.run_option(experiment, "read_limit_mbs")
        return None if limit is None else float(limit)

    def net(self, experiment: str) -> str:
        """The experiment's net as `firescale train --net` takes it: a built-in name, or a net file's absolute
        path."""
        return experiment_net(self.experiment(experiment)["net"], self.base)

    def solver(self, experiment: str) -> SolverConfig:
        """The experiment's solver file, read as the trainer reads it."""
        return load_solver(self.resolve(self.experiment(experiment)["solver"]))

    def dataset_manifest(self, experiment: str) -> tuple[dict[str, Any] | None, Path]:
        """The ingested dataset's manifest (None before ingest, or for a dataset without one) and its path."""
        folder = self.dataset_dir(experiment)
        return manifest_if_ingested(folder), folder / MANIFEST

    def train_images(self, experiment: str) -> tuple[int | None, str]:
        """The training-set size and where it comes from (the manifest, or a known dataset's size)."""
        manifest, path = self.dataset_manifest(experiment)
        if manifest is not None:
            try:
                return int(manifest["splits"]["train"]["records"]), str(path)
            except (KeyError, TypeError, ValueError):
                raise FirescaleError(f"{path}: a manifest needs splits.train.records") from None
        name = self.dataset(experiment)["name"]
        if name in KNOWN_TRAIN_IMAGES:
            return KNOWN_TRAIN_IMAGES[name], f"the {name} training set (no manifest at {path})"
        return None, f"no manifest at {path}"

    def budget(self, experiment: str, point: SweepPoint) -> Budget:
        """The point's fixed-epoch budget: max_iter and the solver keys its job overrides."""
        size, source = self.train_images(experiment)
        where = f" of dataset {self.dataset(experiment)['name']!r} ({source})"
        baseline_batch = self.experiment(experiment)["batch"]["baseline"]
        return point_budget(self.solver(experiment), baseline_batch, point, size, where)

    def anchored_config(self) -> dict[str, Any]:
        """The config with its relative paths (solver, net file, layer_plan) made absolute from the project
        folder (`sweep.descriptions` writes them relative to the commands' project folder)."""
        config = copy.deepcopy(self.config)
        config.pop("recalibrate", None)   # how this run calibrates, not what the experiments are: no re-plan
        config.pop("framework", None)     # already each experiment's own (sweep.config)
        for exp in config["experiments"].values():
            exp["solver"] = str(self.resolve(exp["solver"]))
            exp["net"] = experiment_net(exp["net"], self.base)
            sweeps = [exp["sweep"], *(keys for keys in exp["sites"].values() if keys)]
            for point in (p for sweep in sweeps for p in sweep.get("points", [])):
                if point.get("layer_plan"):
                    point["layer_plan"] = str(self.resolve(point["layer_plan"]))
        return config

    def io_measurement(self) -> Path:
        """Where a cluster's read measurement goes (`bench io --json`, run in a job on one node)."""
        return Path("results") / self.site.name / "bench-io.json"

    def calibration_options(self, experiment: str) -> list[str]:
        """The measurements of `predict calibrate` in the experiment's calibration job, as argv.

        A short second run at a smaller batch than the baseline's fits the fixed per-iteration overhead
        (short_run_batch: every point's per-rank batch then lies between two measured ones), started as
        often as the baseline repeats, so that both batches of the fit are means of as many runs.  Where the
        sweep's most ranks are several, Horovod's allreduce of the net's gradients timed over as many fits the
        communication factor (beside the step's backward pass too when a TensorFlow experiment overlaps them; a
        PyTorch experiment's records name its backend, and its trainer's allreduce is probed over the process group its
        runs take), and
        where they share a node, the short run started once for each of a node's ranks at once measures the
        node's contention.  A cluster also takes a node's read bandwidth from results/<site>/bench-io.json
        when someone measured it in a job (on this machine the runs' own reads are in their times).  Time
        limits keep the job within its walltime (the site's default) should every step run out of its limit:
        the probe rounds take half (with one node's ranks probed as well where node_probe_ranks says), the
        short run and the rounds of its copies (on the node counts contention_nodes gives) the other."""
        most = max(p.ranks for p in self.points[experiment])
        walltime = parse_walltime(self.site.default_walltime)
        shorts = len(self.baselines(experiment))
        steps = shorts + CONTENTION_ROUNDS * len(contention_nodes(self.site, most))   # no copies at one rank
        argv = ["--short-run", "300", "--short-batch", str(self.short_run_batch(experiment)),
                "--short-runs", str(shorts), "--run-timeout", f"{timeout_within(walltime, steps, RUN_TIMEOUT_S):g}"]
        if most > 1:
            probes = 2 if node_probe_ranks(self.site, most) else 1
            timeout = timeout_within(walltime, probes * PROBE_ROUNDS, PROBE_TIMEOUT_S)
            argv += ["--allreduce-probe", str(most), "--probe-timeout", f"{timeout:g}"]
            if self.overlap_allreduce(experiment) and REGISTRY[self.framework(experiment)].probe_overlap:
                argv.append("--probe-overlap")   # else its probe times the allreduce on its own
        if self.site.scheduler != "local" and self.io_measurement().is_file():
            argv += ["--io-record", str(self.io_measurement().resolve())]
        return argv

    def short_run_batch(self, experiment: str) -> int:
        """The per-rank batch of the calibration's short run: half the baseline's, or the smallest a point's
        rank trains at when that is smaller (the widest point of a fixed total batch), so that the compute of
        every point is read between two measured batches rather than extrapolated below them, where the
        fitted overhead weighs most."""
        baseline = self.baselines(experiment)[0].batch
        smallest = min((batch // p.ranks for p in self.points[experiment]
                        for batch in (p.batch, *(b for _, b in p.schedule))), default=baseline)
        return max(1, min(baseline // 2, smallest))

    def point_names(self, experiment: str) -> list[str]:
        return [p.name for p in self.points[experiment]]

    def dataset(self, experiment: str) -> dict[str, Any]:
        return self.experiment(experiment)["dataset"]

    def dataset_source(self, name: str) -> str:
        """The ingest source of the dataset called `name`."""
        for experiment in self.points:
            if self.dataset(experiment)["name"] == name:
                return self.dataset(experiment)["source"]
        raise FirescaleError(f"no experiment of site {self.site.name} uses dataset {name!r}")

    def dataset_manifest_pattern(self) -> str:
        """Where an ingested dataset's manifest lands: the site's datasets path, `{dataset}` left open;
        relative to the working directory (Snakemake's) where it lies inside it, so that a moved project is
        the same plan."""
        return portable(self.site.paths.datasets.resolve() / "{dataset}" / "manifest.json", Path.cwd().resolve())

    def dataset_dir(self, experiment: str) -> Path:
        return _dataset_dir(self.site, self.experiment(experiment))

    def files(self, pattern: str, experiment: str | None = None, *, lr_search: bool = False) -> list[str]:
        """`pattern` filled in for every point (of one experiment, or of all; or only the points of
        learning-rate searches)."""
        names = [experiment] if experiment else list(self.points)
        return [pattern.format(site=self.site.name, experiment=e, point=p.name)
                for e in names for p in (self.lr_search(e) if lr_search else self.points[e])]


def _dataset_dir(site: SiteProfile, exp: dict[str, Any]) -> Path:
    """Where the site keeps the experiment's dataset."""
    return (site.paths.datasets / exp["dataset"]["name"]).resolve()


def load_plan(site: str | SiteProfile, config: str | Path | None = None, *, experiments: list[str] | None = None,
              check_limits: bool = True) -> SweepPlan:
    """The SweepPlan a command works from: the site (a name, a path or a profile already checked), the
    experiments file given on the command line or the default one, and the experiments asked for."""
    profile = site if isinstance(site, SiteProfile) else load_site(site)
    path = config_file(config)
    loaded = load_config(path, {"site": profile.name})
    return SweepPlan.build(loaded, profile, experiments=experiments, source=path, check_limits=check_limits)
