"""What each rule of the workflow depends on: one experiment's resolved settings, and one point's.

Snakemake reruns a job whose input is newer than its output.  The workflow's commands read the experiments
from a file it writes, so that file decides what is stale: one shared file made every point of every
experiment stale whenever any experiment changed.  Instead the workflow writes, for each experiment,

- `results/<site>/<experiment>/experiment.yaml`: the experiments file the commands read, holding that
  experiment alone (and a digest of the site's profile), for the rules of the whole experiment (prediction,
  calibration, report);
- `results/<site>/<experiment>/points/<point>.yaml`: everything one point's job depends on (the site, the
  experiment's settings but its list of points, the point itself, digests of the files it names), for the
  rules of that point (its job script, its run).

Each file is rewritten only when its text changes, and names the files of the project relative to the
project folder, so that adding, editing or removing one experiment or point, or moving the project folder,
leaves every other file and its mtime as it was.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from firescale.atomic import atomic_write_text
from firescale.sweep.paths import portable, project_folder

if TYPE_CHECKING:
    from firescale.sweep.plan import SweepPlan

EXPERIMENT_FILE = "experiment.yaml"
POINTS_FOLDER = "points"
# Sweep keys that list the points rather than set how each one trains: a point's description leaves them
# out, since the point itself says what they gave it.
POINT_LISTING_KEYS = ("gpus", "batch", "batch_schedules", "lr", "points", "repeats")
# Experiment keys no run reads (`calibrate` decides the experiment's calibration and report, not a point's job).
UNREAD_KEYS = ("description", "calibrate")


def portable_config(plan: SweepPlan, experiments: list[str] | None = None) -> dict[str, Any]:
    """The plan's config (of `experiments`, default all) with its paths (solver, net file, mean, layer plans)
    read from the plan's project folder and written relative to the commands' project folder, where they lie
    inside it: the same files, wherever the folder is moved."""
    project = project_folder()
    config = plan.anchored_config()
    names = experiments if experiments is not None else list(config["experiments"])
    config["experiments"] = {name: config["experiments"][name] for name in names}
    for exp in config["experiments"].values():
        exp["solver"] = portable(exp["solver"], project)
        if Path(exp["net"]).is_absolute():
            exp["net"] = portable(exp["net"], project)
        transform = exp["dataset"].get("transform") or {}
        if isinstance(transform.get("mean"), str):
            transform["mean"] = portable(plan.resolve(transform["mean"]), project)
        for point in _explicit_points(exp):
            if point.get("layer_plan"):
                point["layer_plan"] = portable(point["layer_plan"], project)
    return config


def _explicit_points(exp: dict[str, Any]) -> list[dict[str, Any]]:
    sweeps = [exp["sweep"], *(keys for keys in exp["sites"].values() if keys)]
    return [p for sweep in sweeps for p in sweep.get("points", [])]


def site_digest(plan: SweepPlan) -> str:
    """A digest of the site's profile as validated (defaults filled in): a changed site re-plans its points."""
    return _digest(plan.site.config)


def file_digest(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of a file the experiment names (None for one that is not there yet)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def experiment_config(plan: SweepPlan, experiment: str) -> tuple[str, str]:
    """The text of the experiment's own experiments file (`site` and that experiment alone) and a
    one-line header naming the site's digest."""
    config = portable_config(plan, [experiment])
    header = (f"# written by the workflow: experiment {experiment} on site {plan.site.name} as this run sees it\n"
              f"# (profile and --configfile included; paths from the project folder); site profile "
              f"{site_digest(plan)}\n")
    return header, yaml.safe_dump(config, sort_keys=True)


def point_description(plan: SweepPlan, experiment: str, point_name: str) -> dict[str, Any]:
    """Everything the job of one point depends on, and nothing another point changes."""
    config = portable_config(plan, [experiment])
    exp = copy.deepcopy(config["experiments"][experiment])
    run_options = {**exp.pop("sweep"), **(exp.pop("sites").get(plan.site.name) or {})}
    for key in (*POINT_LISTING_KEYS, "epochs", "walltime"):
        run_options.pop(key, None)            # the point carries its epochs; its walltime comes below
    for key in UNREAD_KEYS:
        exp.pop(key, None)
    point = plan.point(experiment, point_name)
    fields = dataclasses.asdict(point)
    if fields.get("layer_plan"):
        fields["layer_plan"] = portable(plan.resolve(fields["layer_plan"]), project_folder())
    files = {"solver": file_digest(plan.resolve(plan.experiment(experiment)["solver"]))}
    net = plan.net(experiment)
    if Path(net).is_absolute():
        files["net"] = file_digest(net)
    if point.layer_plan:
        files["layer_plan"] = file_digest(plan.resolve(point.layer_plan))
    return {"site": plan.site.name, "site_profile": site_digest(plan), "experiment": experiment,
            "settings": exp, "run_options": run_options, "walltime": plan.walltimes[experiment],
            "point": fields, "files": files}


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` atomically unless it holds that already (its mtime then stays)."""
    try:
        if path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    atomic_write_text(path, text)
    return True


def write_config(plan: SweepPlan, path: str | os.PathLike[str]) -> str:
    """Write the plan's config of every experiment (for `results table`), paths from the project folder,
    only when it changed."""
    text = ("# written by the workflow: the experiments as this run sees them, paths from the project\n"
            + yaml.safe_dump(portable_config(plan), sort_keys=True))
    write_if_changed(Path(path), text)
    return str(path)


def write_descriptions(plan: SweepPlan, results: str | os.PathLike[str]) -> dict[str, Path]:
    """Write every experiment's and point's description under `results` (results/<site>), each only when
    its text changed; returns each experiment's experiments file."""
    written = {}
    for experiment in plan.points:
        folder = Path(results) / experiment
        header, body = experiment_config(plan, experiment)
        write_if_changed(folder / EXPERIMENT_FILE, header + body)
        written[experiment] = folder / EXPERIMENT_FILE
        for point in plan.points[experiment]:
            text = (f"# written by the workflow: what the job of point {point.name} depends on\n"
                    + yaml.safe_dump(point_description(plan, experiment, point.name), sort_keys=True))
            write_if_changed(folder / POINTS_FOLDER / f"{point.name}.yaml", text)
    return written
