"""Predict every sweep point of one experiment on one site: iteration time, time-to-accuracy, speedup."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from firescale.cluster.site import SiteProfile
from firescale.data.batch import batches_per_read
from firescale.errors import FirescaleError
from firescale.frameworks import REGISTRY
from firescale.model.layers import net_cost
from firescale.model.paleo import (
    Platform,
    compute_times,
    platform_from_site,
    process_group_algorithm,
    site_algorithm,
    site_process_group,
    with_precision,
)
from firescale.nets.spec import NetSpec
from firescale.predict.calibrate import Calibration
from firescale.predict.memory_fit import experiment_fits
from firescale.predict.phases import predict_phases
from firescale.predict.trained_net import trained_net
from firescale.sweep.budget import KNOWN_TRAIN_IMAGES
from firescale.sweep.plan import SweepPlan
from firescale.sweep.points import SweepPoint

PREDICTION_FORMAT = "firescale.predict.experiment/1"
# ILSVRC-2012's training set, for a dataset called ilsvrc12 when neither its manifest nor --dataset-size
# is at hand (e.g. an archival site).
ILSVRC12_TRAIN_IMAGES = KNOWN_TRAIN_IMAGES["ilsvrc12"]


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
    test_initialization: bool = False   # Caffe's evaluation before the first iteration
    solver_epochs: float = 0.0          # the epochs the solver's max_iter makes at the baseline batch

    def to_dict(self) -> dict[str, Any]:
        return {"net": self.net.name, "input_shape": list(self.net.input_shape), "classes": self.net.num_classes,
                "dataset_size": self.dataset_size, "dataset_size_source": self.dataset_size_source,
                "epochs": self.epochs, "epochs_source": self.epochs_source, "test_interval": self.test_interval,
                "test_size": self.test_size, "test_initialization": self.test_initialization,
                "solver_epochs": self.solver_epochs}


def _net_and_size(plan: SweepPlan, experiment: str, dataset_size: int | None) -> tuple[NetSpec, int, str, int]:
    """The net (input shape from the manifest and crop), the training-set size and its source, the test size."""
    dataset = plan.experiment(experiment)["dataset"]
    net = trained_net(plan, experiment)
    path = net.manifest
    if net.train_records is not None:
        if dataset_size is not None and dataset_size != net.train_records:
            raise FirescaleError(f"--dataset-size {dataset_size} disagrees with {path}, whose train split has "
                                 f"{net.train_records} records; drop the option or re-ingest")
        return net.spec, net.train_records, str(path), net.test_records
    if dataset_size is not None:
        return net.spec, dataset_size, "--dataset-size", 0
    if dataset["name"] in KNOWN_TRAIN_IMAGES:
        source = f"the {dataset['name']} training set (no manifest at {path})"
        return net.spec, KNOWN_TRAIN_IMAGES[dataset["name"]], source, 0
    raise FirescaleError(f"experiment {experiment}: dataset {dataset['name']!r} has no manifest at {path}; "
                         "ingest it first or give --dataset-size")


def experiment_model(plan: SweepPlan, experiment: str, dataset_size: int | None = None,
                     epochs: tuple[float, str] | None = None) -> ExperimentModel:
    """The net, the training-set size and the baseline's epochs to model (the given ones, the
    experiment's, or the solver's max_iter at the baseline batch), with where each came from."""
    exp = plan.experiment(experiment)
    spec, size, size_source, test_size = _net_and_size(plan, experiment, dataset_size)
    solver = plan.solver(experiment)
    base_batch = exp["batch"]["baseline"]
    evaluation = {"test_interval": solver.test_interval if test_size else 0, "test_size": test_size,
                  "test_initialization": solver.test_initialization,
                  "solver_epochs": solver.max_iter * base_batch / size}
    if epochs is not None:
        return ExperimentModel(spec, size, size_source, float(epochs[0]), epochs[1], **evaluation)
    if exp.get("epochs") is not None:
        return ExperimentModel(spec, size, size_source, float(exp["epochs"]), f"experiments.{experiment}.epochs",
                               **evaluation)
    source = f"max_iter {solver.max_iter} of {exp['solver']} at the baseline batch {base_batch}"
    return ExperimentModel(spec, size, size_source, evaluation["solver_epochs"], source, **evaluation)


def evaluation_count(model: ExperimentModel, iterations: int, batch_ratio: float = 1.0) -> int:
    """How many evaluations a run of `iterations` makes: one every test_interval iterations (scaled to the
    point's batch: test_interval x baseline batch / batch), and one first with test_initialization."""
    if not model.test_interval or not model.test_size:
        return 0
    interval = max(1, round(model.test_interval * batch_ratio))
    return math.ceil(iterations / interval) + int(model.test_initialization)


def evaluation_s(model: ExperimentModel, platform: Platform, gpus: int, iterations: int,
                 calibration: Calibration | None = None, batch_ratio: float = 1.0) -> float:
    """Seconds spent evaluating before `iterations` are done: one evaluation every test_interval
    iterations (the one that sees the target included), and one before the first iteration when the
    solver has Caffe's test_initialization, each sharded over the `gpus` devices.

    One evaluation takes the baseline's measured time when the calibration has it, else the forward
    pass over the test set at the platform's compute factor (Paleo's forward time; no overhead).  Where
    several devices share a node, their shards take the platform's contention longer, as training does.
    """
    evaluations = evaluation_count(model, iterations, batch_ratio)
    if not evaluations:
        return 0.0
    shared = platform.contention_at(gpus)    # one device evaluates alone
    if calibration is not None and calibration.eval_s > 0:
        return evaluations * calibration.eval_s / gpus * shared
    per_device = math.ceil(model.test_size / gpus)
    return evaluations * shared * compute_times(net_cost(model.net, per_device), platform.device,
                                                elementwise=platform.elementwise, profile=platform.profile).forward


def experiment_platform(site: SiteProfile, calibration: Calibration | None = None) -> Platform:
    """The site's platform, with a calibration of that same site applied."""
    platform = platform_from_site(site)
    if calibration is None:
        return platform
    if calibration.site != site.name:
        raise FirescaleError(f"the calibration is for site {calibration.site!r}, not {site.name!r}; "
                             "calibrate on this site or leave --calibration out")
    return calibration.apply(platform)


def predict_experiment(plan: SweepPlan, experiment: str, *, calibration: Calibration | None = None,
                       dataset_size: int | None = None, platform: Platform | None = None,
                       epochs: tuple[float, str] | None = None) -> dict[str, Any]:
    """Every sweep point of `experiment` predicted on the plan's site, keyed by point name.

    Strong scaling of each point's total batch; the allreduce is the site's, with Horovod's negotiation cycle
    for a TensorFlow experiment; a PyTorch one's is its process group's (Gloo's ring, or the site's for MPI and
    NCCL), with no cycle.  Time to accuracy is the
    model's iterations for `epochs` over the training set, as Paleo assumes the same epochs at every
    point (`epochs`, with where they come from, overrides the experiment's), plus the evaluations on
    the way (`evaluation_s`); the speedup is the 1-GPU baseline's time to accuracy over the point's.
    """
    if experiment not in plan.points:
        raise FirescaleError(f"experiment {experiment!r} does not run on site {plan.site.name!r}; "
                             f"its experiments: {', '.join(sorted(plan.points)) or 'none'}")
    model = experiment_model(plan, experiment, dataset_size, epochs)
    platform = platform or experiment_platform(plan.site, calibration)
    platform = with_precision(platform, plan.site, plan.experiment(experiment).get("precision", "fp32"))
    algorithm = plan.site.allreduce
    platform = replace(platform, algorithm=site_algorithm(plan.site))
    group = None
    chosen = REGISTRY[plan.framework(experiment)]
    if chosen.names_process_group:
        # the process group the runs' ranks will take (auto), priced as what it runs: Gloo's ring, MPI's the site's
        group = site_process_group(plan.site, plan.experiment(experiment).get("process_group", "auto"))
        platform = replace(platform, algorithm=process_group_algorithm(plan.site, group))
    if not chosen.negotiation_cycle:   # its allreduce waits for no background cycle (Horovod's)
        platform = replace(platform, cycle_s=0.0)
    if (limit := plan.read_limit_mbs(experiment)) is not None:   # MB as the trainer's limit counts them: 1e6 bytes
        platform = replace(platform, data=replace(platform.data, rank_read_bandwidth=limit * 1e6))

    points = plan.points[experiment]
    overlap = plan.overlap_allreduce(experiment)
    image_bytes = stored_image_bytes(plan, experiment)
    baseline = next(p for p in points if p.baseline)
    budget = lambda p: p.epochs if p.epochs is not None else model.solver_epochs  # noqa: E731

    def one(p: Any) -> tuple[Any, float, float]:
        """The point's prediction, its time to accuracy and its evaluating (all its evaluations): fixed-epoch
        budgets give every point the baseline's epochs, times the ratio of the epochs the experiment states for
        each."""
        pred = predict_phases(platform, model.net, p, model.epochs * budget(p) / budget(baseline),
                              model.dataset_size, scaling="strong",   # a batch schedule: phase by phase
                              overlap=overlap,   # the DAG model's overlapped schedule for overlapped runs
                              image_bytes=image_bytes)
        evaluating = evaluation_s(model, platform, p.ranks, pred.iterations, calibration,
                                  batch_ratio=baseline.batch / p.batch)
        return pred, pred.time_to_accuracy_s + evaluating, evaluating

    base_total = one(baseline)[1]
    out: dict[str, Any] = {}
    for p in points:
        pred, total, evaluating = one(p)
        out[p.name] = {"gpus": p.gpus, "batch": p.batch, "lr": p.lr, "epochs": pred.epochs,
                       "iteration_s": pred.iteration_s,
                       "iterations": pred.iterations, "training_s": pred.time_to_accuracy_s,
                       "batches_per_read": reads_at_once(model.net, p),
                       "evaluation_s": evaluating,
                       "evaluations": evaluation_count(model, pred.iterations, baseline.batch / p.batch),
                       "time_to_accuracy_s": total, "speedup": base_total / total,
                       "allreduce_model": pred.comm_algorithm, "nodes": pred.nodes, "comm_s": pred.comm_s,
                       "comm_intra_s": pred.comm_intra_s, "comm_inter_s": pred.comm_inter_s,
                       "io_s": pred.io_s, "h2d_s": pred.h2d_s}
    fits = experiment_fits(plan, experiment, points)
    for fit in fits:
        out[fit.point]["memory"] = fit.to_dict()
    return {
        "format": PREDICTION_FORMAT,
        "site": plan.site.name,
        "experiment": experiment,
        "memory_problems": [f.problem for f in fits if f.problem],
        "allreduce": algorithm,
        "process_group": group,   # a PyTorch experiment's (None: Horovod's ranks)
        "overlap_allreduce": overlap,
        "calibration": calibration.to_dict() if calibration else None,
        "calibrated": calibration is not None,
        "percent_of_peak": percent_of_peak(platform, calibration),
        "model": {**model.to_dict(), "platform": {**_platform_dict(platform),
                                                  "read_bandwidth_source": read_bandwidth_source(platform)}},
        "points": out,
    }


def percent_of_peak(platform: Platform, calibration: Calibration | None) -> dict[str, Any]:
    """The percents of peak the prediction assumed, compute's and the links', and where each came from:
    "calibration" (fitted from runs on the site), "layer profile" (compute: the site's measured layer times,
    the percent of peak for layers it lacks), "given" (the caller's own: --ppp-compute, --ppp-comm) or
    "peak" (1, the device's or the link's peak: nothing calibrated it)."""
    def source(ppp: float, profiled: bool = False) -> str:
        if calibration is not None:
            return "calibration"
        return "layer profile" if profiled else "peak" if ppp == 1.0 else "given"

    compute, comm = platform.device.ppp, platform.link.ppp
    return {"compute": compute, "compute_source": source(compute, platform.profile is not None),
            "comm": comm, "comm_source": source(comm)}


def read_bandwidth_source(platform: Platform) -> str | None:
    """Where the platform's per-node read bandwidth (t_io's B_io) came from: "site" (its
    storage.read_gbytes_per_s), "calibration" (a `bench io` record stored by `predict calibrate`),
    "platform" (the caller's own), or None when it has none."""
    if platform.data.read_bandwidth <= 0:
        return None
    return platform.data.read_source or "platform"


def reads_at_once(net: NetSpec, p: SweepPoint) -> int:
    """The most training batches the point's ranks read in one go (data.batch.batches_per_read): its smallest
    batch per rank over its batch schedule, as the net takes its images (the stall watch counts on it)."""
    smallest = min([p.batch, *(total for _, total in p.schedule)])
    return batches_per_read(max(1, smallest // p.ranks), net.input_shape)


def stored_image_bytes(plan: SweepPlan, experiment: str) -> float | None:
    """Bytes a rank reads per image: the manifest's stored shape at one byte a pixel (None before ingest:
    the net's input)."""
    manifest, _ = plan.dataset_manifest(experiment)
    return None if manifest is None else float(math.prod(int(v) for v in manifest["shape"]))


def _platform_dict(platform: Platform) -> dict[str, Any]:
    d, link, links, data = platform.device, platform.link, platform.links, platform.data
    return {"device": d.name, "peak_flops": d.peak_flops, "memory_bandwidth": d.memory_bandwidth,
            "ppp_compute": d.ppp, "link_bandwidth": link.bandwidth, "link_latency": link.latency,
            "ppp_comm": link.ppp, "algorithm": platform.algorithm, "overhead_s": platform.overhead_s,
            "ranks_per_node": links.ranks_per_node, "hierarchical_allreduce": links.hierarchical,
            "intra_link_bandwidth": None if links.intra is None else links.intra.bandwidth,
            "intra_link_latency": None if links.intra is None else links.intra.latency,
            "read_bandwidth": data.read_bandwidth, "shared_read_bandwidth": data.shared_read_bandwidth,
            "h2d_bandwidth": data.h2d_bandwidth, "overlap_io": data.overlap_io,
            "rank_read_bandwidth": data.rank_read_bandwidth}


def baseline_epochs_to_target(record_path: str | Path, tolerance: float,
                              accuracy: float | None = None) -> tuple[float, str]:
    """The epochs the baseline run needed to reach the sweep's target (a fixed top-1, or its own final
    top-1 minus `tolerance`): its first evaluation at or above it.  The sweep's points race to the same
    accuracy, so after the baseline this replaces the solver's whole max_iter as the epochs to model."""
    from firescale.atomic import load_json

    record = load_json(record_path, "baseline run record")
    train = record.get("train") if isinstance(record, dict) else None
    evals = (train or {}).get("evals") or []
    if not evals:
        raise FirescaleError(f"{record_path}: the baseline has no evaluations (outcome {record.get('outcome')!r})")
    target = accuracy if accuracy is not None else float(evals[-1]["top1"]) - tolerance
    hit = next((e for e in evals if float(e["top1"]) >= target), evals[-1])
    epoch = float(hit["epoch"])
    return epoch, f"the baseline reached top-1 {target:.4f} after {epoch:.3g} epochs ({record_path})"
