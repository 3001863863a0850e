"""Predict every sweep point of one experiment on one site: iteration time, time-to-accuracy, speedup."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import FirescaleError
from ..netspec import NetSpec, get_net
from .calibrate import Calibration
from .layers import net_cost
from .paleo import Platform, compute_times, platform_from_site, predict_point

PREDICTION_FORMAT = "firescale.predict.experiment/1"
# ILSVRC-2012's training set (the 1.28M images FireCaffe and Caffe's ImageNet example train on); used for a
# dataset called ilsvrc12 when neither its manifest nor --dataset-size is at hand (e.g. an archival site).
ILSVRC12_TRAIN_IMAGES = 1_281_167


@dataclass(frozen=True)
class ExperimentModel:
    """What the model assumed for an experiment: net, dataset size, epochs, and where each came from;
    and the evaluations on the way (every `test_interval` iterations, over `test_size` images)."""

    net: NetSpec
    dataset_size: int
    dataset_size_source: str
    epochs: float
    epochs_source: str
    test_interval: int = 0
    test_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"net": self.net.name, "input_shape": list(self.net.input_shape), "classes": self.net.num_classes,
                "dataset_size": self.dataset_size, "dataset_size_source": self.dataset_size_source,
                "epochs": self.epochs, "epochs_source": self.epochs_source, "test_interval": self.test_interval,
                "test_size": self.test_size}


def _manifest(plan: Any, experiment: str) -> tuple[dict[str, Any] | None, Path]:
    path = plan.dataset_dir(experiment) / "manifest.json"
    if not path.is_file():
        return None, path
    try:
        return json.loads(path.read_text()), path
    except (OSError, json.JSONDecodeError) as exc:
        raise FirescaleError(f"{path}: cannot read the dataset manifest ({exc})") from None


def experiment_net(plan: Any, experiment: str) -> tuple[NetSpec, int | None]:
    """The experiment's net as it trains (input shape from the dataset's manifest and the crop, the
    manifest's classes) and the training records the manifest counts (None without a manifest)."""
    exp = plan.config["experiments"][experiment]
    manifest, path = _manifest(plan, experiment)
    crop = (exp["dataset"].get("transform") or {}).get("crop")
    if manifest is None:
        spec = get_net(exp["net"])
        return (get_net(exp["net"], input_shape=(int(crop), int(crop), spec.input_shape[2])) if crop else spec), None
    try:
        records = int(manifest["splits"]["train"]["records"])
        stored = tuple(int(v) for v in manifest["shape"])
        classes = int(manifest["num_classes"])
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{path}: a manifest needs splits.train.records, shape and num_classes") from None
    shape = (int(crop), int(crop), stored[2]) if crop else stored
    return get_net(exp["net"], num_classes=classes, input_shape=shape), records


def experiment_model(plan: Any, experiment: str, dataset_size: int | None = None,
                     epochs: tuple[float, str] | None = None) -> ExperimentModel:
    """The net (input shape from the manifest and crop), the training-set size and the epochs to model."""
    exp = plan.config["experiments"][experiment]
    dataset = exp["dataset"]
    spec, records = experiment_net(plan, experiment)
    manifest, path = _manifest(plan, experiment)
    if records is not None:
        if dataset_size is not None and dataset_size != records:
            raise FirescaleError(f"--dataset-size {dataset_size} disagrees with {path}, whose train split has "
                                 f"{records} records; drop the option or re-ingest")
        size, size_source = records, str(path)
    else:
        if dataset_size is not None:
            size, size_source = dataset_size, "--dataset-size"
        elif dataset["name"] == "ilsvrc12":
            size, size_source = ILSVRC12_TRAIN_IMAGES, "ILSVRC-2012 training set (no manifest at " + str(path) + ")"
        else:
            raise FirescaleError(f"experiment {experiment}: dataset {dataset['name']!r} has no manifest at {path}; "
                                 "ingest it first or give --dataset-size")
    from ..sweep import repo_root
    from ..train.solver_config import load_solver

    solver_path = Path(exp["solver"])
    solver = load_solver(solver_path if solver_path.is_absolute() else repo_root() / solver_path)
    test_size = int(manifest["splits"].get("test", {}).get("records", 0)) if manifest is not None else 0
    evaluation = {"test_interval": solver.test_interval if test_size else 0, "test_size": test_size}
    if epochs is not None:
        return ExperimentModel(spec, size, size_source, float(epochs[0]), epochs[1], **evaluation)
    if exp.get("epochs") is not None:
        epochs, epochs_source = float(exp["epochs"]), f"experiments.{experiment}.epochs"
    else:
        base = next(p for p in plan.points[experiment] if p.baseline)
        epochs = solver.max_iter * base.batch / size
        epochs_source = f"max_iter {solver.max_iter} of {exp['solver']} at the baseline batch {base.batch}"
    return ExperimentModel(spec, size, size_source, epochs, epochs_source, **evaluation)


def evaluation_s(model: ExperimentModel, platform: Platform, gpus: int, iterations: int,
                 calibration: Calibration | None = None) -> float:
    """Seconds spent evaluating before `iterations` are done: one evaluation every test_interval
    iterations (the one that sees the target included), each sharded over the `gpus` devices.

    One evaluation takes the baseline's measured time when the calibration has it, else the forward
    pass over the test set at the platform's compute factor (Paleo's forward time; no overhead).
    """
    if not model.test_interval or not model.test_size:
        return 0.0
    evaluations = math.ceil(iterations / model.test_interval)
    if calibration is not None and calibration.eval_s > 0:
        return evaluations * calibration.eval_s / gpus
    per_device = math.ceil(model.test_size / gpus)
    return evaluations * compute_times(net_cost(model.net, per_device), platform.device,
                                       elementwise=platform.elementwise).forward


def experiment_platform(site: Any, calibration: Calibration | None = None) -> Platform:
    """The site's platform, with a calibration of that same site applied."""
    platform = platform_from_site(site)
    if calibration is None:
        return platform
    if calibration.site != site.name:
        raise FirescaleError(f"the calibration is for site {calibration.site!r}, not {site.name!r}; "
                             "calibrate on this site or leave --calibration out")
    return calibration.apply(platform)


def predict_experiment(plan: Any, experiment: str, *, calibration: Calibration | None = None,
                       dataset_size: int | None = None, platform: Platform | None = None,
                       epochs: tuple[float, str] | None = None) -> dict[str, Any]:
    """Every sweep point of `experiment` predicted on the plan's site, keyed by point name.

    Strong scaling of each point's total batch; the allreduce is the site's.  Time to accuracy is the
    model's iterations for `epochs` over the training set, as Paleo assumes the same epochs at every
    point (`epochs`, with where they come from, overrides the experiment's), plus the evaluations on
    the way (`evaluation_s`); the speedup is the 1-GPU baseline's time to accuracy over the point's.
    """
    if experiment not in plan.points:
        raise FirescaleError(f"experiment {experiment!r} does not run on site {plan.site.name!r}; "
                             f"its experiments: {', '.join(sorted(plan.points)) or 'none'}")
    model = experiment_model(plan, experiment, dataset_size, epochs)
    platform = platform or experiment_platform(plan.site, calibration)
    algorithm = plan.site.allreduce
    platform = replace(platform, algorithm=platform_from_site(plan.site).algorithm)

    def one(gpus: int, batch: int) -> Any:
        return predict_point(platform, model.net, gpus, batch, epochs=model.epochs, dataset_size=model.dataset_size,
                             scaling="strong")

    points = plan.points[experiment]
    baseline = next(p for p in points if p.baseline)
    base = one(1, baseline.batch)
    out: dict[str, Any] = {}
    def total_s(gpus: int, pred: Any) -> tuple[float, float]:
        evaluating = evaluation_s(model, platform, gpus, pred.iterations, calibration)
        return pred.time_to_accuracy_s + evaluating, evaluating

    base_total, _ = total_s(1, base)
    for p in points:
        pred = base if p.baseline else one(p.gpus, p.batch)
        total, evaluating = total_s(p.gpus, pred)
        out[p.name] = {"gpus": p.gpus, "batch": p.batch, "iteration_s": pred.iteration_s,
                       "iterations": pred.iterations, "training_s": pred.time_to_accuracy_s,
                       "evaluation_s": evaluating, "time_to_accuracy_s": total, "speedup": base_total / total,
                       "allreduce_model": pred.comm_algorithm}
    from .memory_fit import experiment_fits

    fits = experiment_fits(plan.config, experiment, plan.site, points)
    for fit in fits:
        out[fit.point]["memory"] = fit.to_dict()
    return {
        "format": PREDICTION_FORMAT,
        "site": plan.site.name,
        "experiment": experiment,
        "memory_problems": [f.problem for f in fits if f.problem],
        "allreduce": algorithm,
        "calibration": calibration.to_dict() if calibration else None,
        "model": {**model.to_dict(), "platform": _platform_dict(platform)},
        "points": out,
    }


def _platform_dict(platform: Platform) -> dict[str, Any]:
    d, link = platform.device, platform.link
    return {"device": d.name, "peak_flops": d.peak_flops, "memory_bandwidth": d.memory_bandwidth,
            "ppp_compute": d.ppp, "link_bandwidth": link.bandwidth, "link_latency": link.latency,
            "ppp_comm": link.ppp, "algorithm": platform.algorithm, "overhead_s": platform.overhead_s}


def baseline_epochs_to_target(record_path: str | Path, tolerance: float, accuracy: float | None = None) -> tuple[float, str]:
    """The epochs the baseline run needed to reach the sweep's target (a fixed top-1, or its own final
    top-1 minus `tolerance`): its first evaluation at or above it.  The sweep's points race to the same
    accuracy, so after the baseline this replaces the solver's whole max_iter as the epochs to model."""
    from ..atomic import load_json

    record = load_json(record_path, "baseline run record")
    train = record.get("train") if isinstance(record, dict) else None
    evals = (train or {}).get("evals") or []
    if not evals:
        raise FirescaleError(f"{record_path}: the baseline has no evaluations (outcome {record.get('outcome')!r})")
    target = accuracy if accuracy is not None else float(evals[-1]["top1"]) - tolerance
    hit = next((e for e in evals if float(e["top1"]) >= target), evals[-1])
    return float(hit["epoch"]), f"the baseline reached top-1 {target:.4f} after {float(hit['epoch']):.3g} epochs ({record_path})"
