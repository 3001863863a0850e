"""Experiments and their sweep points: load workflow/config.yaml, expand a site's points, check limits."""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import FirescaleError
from .schema_check import describe, schema_errors
from .site import SiteProfile, apply_defaults, parse_walltime
from .yamlfile import load_yaml


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def config_schema() -> dict[str, Any]:
    return yaml.safe_load((repo_root() / "workflow" / "schemas" / "config.schema.yaml").read_text())


@dataclass(frozen=True)
class SweepPoint:
    """One training run of a sweep: GPUs, total batch, initial learning rate, repeat."""

    experiment: str
    gpus: int
    batch: int
    lr: float
    repeat: int
    baseline: bool = False

    @property
    def name(self) -> str:
        return "baseline" if self.baseline else f"g{self.gpus}-b{self.batch}-r{self.repeat}"

    @property
    def batch_per_gpu(self) -> int:
        return self.batch // self.gpus


def load_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """workflow/config.yaml validated against its schema, with defaults; errors name the file and key."""
    path = Path(path)
    config = load_yaml(path, "experiments file")
    if not isinstance(config, dict):
        raise FirescaleError(f"{path}: an experiments file must be a mapping with the keys 'site' and 'experiments', "
                             f"not {'an empty file' if config is None else type(config).__name__}")
    config.update(overrides or {})
    return validate_config(config, path)


def validate_config(config: dict[str, Any], source: str | os.PathLike[str] = "workflow/config.yaml") -> dict[str, Any]:
    schema = config_schema()
    config = copy.deepcopy(config)
    experiments = config.get("experiments")
    for exp in (experiments.values() if isinstance(experiments, dict) else ()):
        if isinstance(exp, dict):
            apply_defaults(schema["$defs"]["experiment"], exp, schema)
    errors = schema_errors(schema, config)
    if errors:
        raise FirescaleError(f"{source}: {describe(errors[0], schema)}")
    return config


def experiments_for(config: dict[str, Any], site: str) -> list[str]:
    """The experiments that list `site` under their `sites`."""
    return sorted(name for name, exp in config["experiments"].items() if site in exp["sites"])


def _scaled_lr(base_lr: float, rule: str, batch: int, baseline_batch: int) -> float:
    ratio = batch / baseline_batch
    return {"none": base_lr, "linear": base_lr * ratio, "sqrt": base_lr * math.sqrt(ratio)}[rule]


def plan_sweep(config: dict[str, Any], experiment: str, site: str, base_lr: float) -> list[SweepPoint]:
    """The baseline and every sweep point of `experiment` on `site`, in a stable order."""
    exp = config["experiments"][experiment]
    sweep = {**exp["sweep"], **(exp["sites"].get(site) or {})}
    mode, baseline_batch = exp["batch"]["mode"], exp["batch"]["baseline"]
    rule = exp["lr_scaling"]
    points = [SweepPoint(experiment, 1, baseline_batch, base_lr, 0, baseline=True)]
    seen = {(1, baseline_batch)}
    grid = [(g, b if mode == "total" else b * g, None) for g in sweep.get("gpus", []) for b in sweep.get("batch", [baseline_batch])]
    grid += [(p["gpus"], p["batch"] if mode == "total" else p["batch"] * p["gpus"], p.get("lr")) for p in sweep.get("points", [])]
    for gpus, batch, lr in grid:
        if (gpus, batch) in seen:
            continue
        seen.add((gpus, batch))
        if batch % gpus:
            raise FirescaleError(f"experiment {experiment}: point g{gpus}-b{batch}: total batch {batch} is not divisible by {gpus} GPUs")
        lr = lr if lr is not None else _scaled_lr(base_lr, rule, batch, baseline_batch)
        points += [SweepPoint(experiment, gpus, batch, lr, r) for r in range(exp["repeats"])]
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
        errors.append(f"walltime {walltime} exceeds site {site.name}'s limits.max_walltime {site.config['limits']['max_walltime']}")
    lead = site.walltime_signal[1]
    if site.scheduler != "local" and wall <= lead:
        errors.append(f"walltime {walltime} is not longer than site {site.name}'s walltime_signal.seconds_before "
                      f"({lead} s): every job would be told to snapshot and stop as soon as it starts")
    for p in points:
        nodes = site.nodes_for(p.gpus)
        if nodes > site.max_nodes:
            errors.append(
                f"point {p.experiment}/{p.name} needs {nodes} nodes ({p.gpus} GPUs at {site.gpus_per_node} per node); "
                f"site {site.name} allows limits.max_nodes {site.max_nodes}"
            )
    return errors


def solver_base_lr(config: dict[str, Any], experiment: str) -> float:
    """The base learning rate of the experiment's solver file (YAML or solver.prototxt)."""
    from .train.solver_config import load_solver  # the trainer's parser: one vocabulary

    solver = Path(config["experiments"][experiment]["solver"])
    return float(load_solver(solver if solver.is_absolute() else repo_root() / solver).base_lr)
