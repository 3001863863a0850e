"""The sweep points of an experiment on a site (GPUs, batch, learning rate, repeat) and the site's limits."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import FirescaleError
from ..site import SiteProfile, parse_walltime
from .paths import in_repo


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


def sweep_walltime(config: dict[str, Any], experiment: str, site: str) -> str:
    exp = config["experiments"][experiment]
    return (exp["sites"].get(site) or {}).get("walltime") or exp["sweep"].get("walltime") or exp["walltime"]


def limit_errors(points: list[SweepPoint], site: SiteProfile, walltime: str) -> list[str]:
    """Each point that asks for more nodes, or longer, than the site allows, named with the limit."""
    errors = []
    wall = parse_walltime(walltime, where="walltime")
    if wall > site.max_walltime_s:
        errors.append(f"walltime {walltime} exceeds site {site.name}'s limits.max_walltime {site.config['limits']['max_walltime']}")
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
    from ..train.solver_config import load_solver  # the trainer's parser: one vocabulary

    return float(load_solver(in_repo(config["experiments"][experiment]["solver"])).base_lr)
