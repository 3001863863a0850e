"""From a sweep point to a JobSpec: the `firescale train` command, its run folder, log and status file."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .render import JobSpec
from .site import SiteProfile, parse_walltime
from .sweep import SweepPoint, repo_root


def run_dir(site: SiteProfile, experiment: str, point: SweepPoint) -> Path:
    """Where the job of `point` trains and writes its result, snapshots, log and status file.

    The site is part of the path: two sites sharing one results filesystem never share a point's folder."""
    return (site.paths.results / site.name / experiment / point.name).resolve()


def dataset_dir(site: SiteProfile, config: dict[str, Any], experiment: str) -> Path:
    return (site.paths.datasets / config["experiments"][experiment]["dataset"]["name"]).resolve()


def train_command(site: SiteProfile, config: dict[str, Any], experiment: str, point: SweepPoint) -> list[str]:
    """argv of one rank: `firescale train` with the point's net, data, solver, batch and target."""
    exp = config["experiments"][experiment]
    solver = Path(exp["solver"]) if Path(exp["solver"]).is_absolute() else repo_root() / exp["solver"]
    out = run_dir(site, experiment, point)
    argv = [*site.config["environment"]["firescale"].split(), "train",
            "--dataset", str(dataset_dir(site, config, experiment)),
            "--net", exp["net"],
            "--solver", str(solver),
            "--out", str(out),
            "--total-batch", str(point.batch),
            "--lr-scaling", "none",
            "--set", f"base_lr={point.lr:.10g}",
            "--warmup-iters", str(exp["warmup_iters"]),
            "--resume"]
    target = exp["target"]
    if "accuracy" in target:
        argv += ["--target", f"{target['accuracy']:.10g}"]
    elif not point.baseline:
        baseline = run_dir(site, experiment, SweepPoint(experiment, 1, exp["batch"]["baseline"], point.lr, 0, True))
        argv += ["--target-from", str(baseline / "result.json"), "--tolerance", f"{target['tolerance']:.10g}"]
    return argv


def job_for_point(site: SiteProfile, config: dict[str, Any], experiment: str, point: SweepPoint, walltime: str) -> JobSpec:
    out = run_dir(site, experiment, point)
    return JobSpec(
        name=f"fs-{experiment[:6]}-{point.name}"[:40],
        ranks=point.gpus,
        walltime_s=parse_walltime(walltime),
        command=train_command(site, config, experiment, point),
        workdir=out,
        log_file=out / "job.log",
        status_file=out / "status.json",
        env={"FIRESCALE_RUN_DIR": str(out), "FIRESCALE_EXPERIMENT": experiment, "FIRESCALE_POINT": point.name},
    )


def point_record(site: SiteProfile, config: dict[str, Any], experiment: str, point: SweepPoint, walltime: str) -> dict[str, Any]:
    """What `firescale sweep run` needs to know of a point besides its script."""
    return {
        "site": site.name, "experiment": experiment, "point": point.name, "gpus": point.gpus,
        "nodes": site.nodes_for(point.gpus), "batch": point.batch, "lr": point.lr, "repeat": point.repeat,
        "baseline": point.baseline, "walltime": walltime, "run_dir": str(run_dir(site, experiment, point)),
        "max_resubmits": min(int(config["experiments"][experiment]["max_resubmits"]), site.max_resubmits),
    }
