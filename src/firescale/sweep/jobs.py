"""From a sweep point to a JobSpec: the `firescale train` command, its run folder, log and status file; and
the experiment's calibration job."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from firescale.cluster.site import parse_walltime
from firescale.frameworks import DEFAULT_FRAMEWORK, DEFAULT_PRECISION
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.spec import JobSpec
from firescale.sweep.paths import CALIBRATION_FILE
from firescale.sweep.plan import SweepPlan
from firescale.sweep.points import SweepPoint
from firescale.sweep.records import PointRecord


def run_dir(plan: SweepPlan, experiment: str, point: SweepPoint) -> Path:
    """Where the job of `point` trains and writes its result, snapshots, log and status file.

    The site is part of the path: two sites sharing one results filesystem never share a point's folder."""
    return (plan.site.paths.results / plan.site.name / experiment / point.name).resolve()


def repeat_seed(random_seed: int, repeat: int) -> int:
    """The seed of a repeat (weights, data order, dropout): the solver's random_seed (1 when unset) plus
    the repeat, so that repeats differ and each repeat of every point starts from the same weights."""
    return (random_seed if random_seed >= 0 else 1) + repeat


def train_command(plan: SweepPlan, experiment: str, point: SweepPoint) -> list[str]:
    """argv of one rank: `firescale train` with the point's net, data, solver, batch, rate and fixed-epoch
    budget (max_iter and the schedule scaled to its batch).  Every run trains its whole budget: the
    report times each to the common target from its evaluations and compares final accuracies.

    A point with a batch schedule starts at its first phase's batch and rate and passes the changes as
    `--batch-schedule`; the trainer scales each later phase's rate from the first by the experiment's
    lr_scaling rule (the reference batch is the first phase's images per update)."""
    exp = plan.experiment(experiment)
    solver = plan.solver(experiment)
    if point.schedule:
        scaling = ["--lr-scaling", exp["lr_scaling"], "--reference-batch", str(point.batch * solver.iter_size),
                   "--batch-schedule", point.schedule_option()]
    else:
        scaling = ["--lr-scaling", "none"]
    argv = [*plan.site.config["environment"]["firescale"].split(), "train",
            "--dataset", str(plan.dataset_dir(experiment)),
            "--net", plan.net(experiment),
            "--solver", str(plan.resolve(exp["solver"])),
            "--out", str(run_dir(plan, experiment, point)),
            "--total-batch", str(point.batch),
            *scaling,
            "--set", f"base_lr={point.lr:.10g}",
            *plan.budget(experiment, point).set_options(),
            "--seed", str(repeat_seed(solver.random_seed, point.repeat)),
            "--warmup-iters", str(exp["warmup_iters"]),
            *transform_options(plan, experiment)]
    if point.layer_plan:  # each rank one replica, its layers over `devices` GPUs
        argv += ["--layer-plan", str(plan.resolve(point.layer_plan))]
    if exp["warmup_iters"]:  # Goyal et al.: warm up from the baseline's (unscaled) rate to the point's
        argv += ["--warmup-start-lr", f"{plan.baselines(experiment)[0].lr:.10g}"]
    argv += framework_options(exp)
    if plan.overlap_allreduce(experiment):
        argv.append("--overlap-allreduce")
    if (limit := plan.read_limit_mbs(experiment)) is not None:
        argv += ["--read-limit-mbs", f"{limit:.10g}"]
    argv.append("--resume")
    return argv


def framework_options(exp: dict[str, Any]) -> list[str]:
    """The experiment's framework, process group and precision as the trainer's options, where they are not the
    defaults."""
    argv = []
    if exp["framework"] != DEFAULT_FRAMEWORK:
        argv += ["--framework", exp["framework"]]
    if exp.get("process_group", "auto") != "auto":
        argv += ["--process-group", exp["process_group"]]
    if exp["precision"] != DEFAULT_PRECISION:
        argv += ["--precision", exp["precision"]]
    return argv


def transform_options(plan: SweepPlan, experiment: str) -> list[str]:
    """The experiment's dataset.transform as the trainer's options: Caffe's scale always, and the mean (values,
    or a mean file read from the project folder), crop and mirror when it gives them (`mirror: false` too, so
    that it wins over a net file's `mirror: true`)."""
    t = plan.dataset(experiment)["transform"]
    argv = ["--scale", f"{t['scale']:.10g}"]
    if isinstance(t["mean"], list):
        argv += ["--mean", ",".join(f"{v:.10g}" for v in t["mean"])]
    elif t["mean"]:
        argv += ["--mean", str(plan.resolve(t["mean"]))]
    if t["crop"]:
        argv += ["--crop", str(t["crop"])]
    return argv + {True: ["--mirror"], False: ["--no-mirror"], None: []}[t["mirror"]]


# The longest job name firescale writes where the scheduler takes longer ones: whole in `squeue -o %.40j`.
JOB_NAME_LENGTH = 40


def job_name(experiment: str, what: str, limit: int = JOB_NAME_LENGTH) -> str:
    """The job name of point (or job) `what` of `experiment`, at most `limit` characters: `fs-`, the
    experiment's name, a tag of four hex digits from its SHA-256 and the point's name, as in
    `fs-fashion-lenet-pt-b40c-g2-b64-r0`.  The tag tells apart experiments whose names share a beginning; the
    experiment's name is cut first to fit, then left out (`fs-b40c-g2-b64-r0`).  A limit too short even for
    that (Torque's 15) keeps the point name's beginning and a tag of its own, so that repeats stay apart
    (`fs-b40c-g2.52cd`).  Letters, digits and _.- only: a schedule's `+` becomes `_`."""
    tag, point = _tag(experiment), _safe(what)
    room = limit - len(f"fs--{tag}-{point}")
    stem = _safe(experiment)[:room].rstrip("-_.") if room > 0 else ""
    if stem:
        return f"fs-{stem}-{tag}-{point}"
    if len(f"fs-{tag}-{point}") <= limit:
        return f"fs-{tag}-{point}"
    own = _tag(what)
    head = point[:max(0, limit - len(f"fs-{tag}-.{own}"))].rstrip("-_.")
    name = f"fs-{tag}-{head}.{own}" if head else f"fs-{tag}-{own}"
    if len(name) > limit:
        raise ValueError(f"a job name limit of {limit} characters cannot hold {name!r}")
    return name


def _tag(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:4]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def _job_name(plan: SweepPlan, experiment: str, what: str) -> str:
    """The job's name within what the site's scheduler keeps of one."""
    length = get_scheduler(plan.site.scheduler).name_length
    return job_name(experiment, what, JOB_NAME_LENGTH if length is None else min(length, JOB_NAME_LENGTH))


def job_for_point(plan: SweepPlan, experiment: str, point: SweepPoint) -> JobSpec:
    out = run_dir(plan, experiment, point)
    return JobSpec(
        name=_job_name(plan, experiment, point.name),
        ranks=point.ranks,
        devices_per_rank=point.devices,
        walltime_s=parse_walltime(plan.walltimes[experiment]),
        command=train_command(plan, experiment, point),
        framework=plan.framework(experiment),
        workdir=out,
        log_file=out / "job.log",
        status_file=out / "status.json",
        env={"FIRESCALE_RUN_DIR": str(out), "FIRESCALE_EXPERIMENT": experiment, "FIRESCALE_POINT": point.name},
    )


def point_record(plan: SweepPlan, experiment: str, point: SweepPoint) -> PointRecord:
    """What `firescale sweep run` needs to know of a point besides its script."""
    return PointRecord(
        site=plan.site.name, experiment=experiment, point=point.name, gpus=point.gpus,
        nodes=plan.site.nodes_for(point.ranks, point.devices), batch=point.batch, lr=point.lr, repeat=point.repeat,
        baseline=point.baseline, walltime=plan.walltimes[experiment], run_dir=str(run_dir(plan, experiment, point)),
        max_resubmits=min(int(plan.experiment(experiment)["max_resubmits"]), plan.site.max_resubmits),
        framework=plan.framework(experiment), stall_after=stall_after(plan, experiment))


def stall_after(plan: SweepPlan, experiment: str) -> float | None:
    """The experiment's stall_after, else the site's limits.stall_after; None: each point's from its prediction
    (`firescale sweep run --prediction`, jobs.stall.default_stall_after)."""
    value = plan.experiment(experiment).get("stall_after", plan.site.stall_after)
    return None if value is None else float(value)


def calibration_dir(plan: SweepPlan, experiment: str) -> Path:
    """Where the experiment's calibration job measures and writes its calibration, log and status file."""
    return (plan.site.paths.results / plan.site.name / experiment / "calibration").resolve()


def calibration_job(plan: SweepPlan, experiment: str) -> JobSpec:
    """The job that calibrates the experiment's predictions where its points run: `firescale predict
    calibrate` as one process on the first node of an allocation as large as the sweep's most ranks, from
    the baseline's results, each of its repeats (their mean is what the report measures the baseline by;
    plan.calibration_options: its run again at a smaller batch, once alone and once for each rank of a node at
    once; Horovod's allreduce over the most ranks with the site's launcher).  It keeps its runs and probes in
    work/ and writes calibration.json last; the site's default walltime."""
    out = calibration_dir(plan, experiment)
    records = [arg for point in plan.baselines(experiment)
               for arg in ("--record", str(run_dir(plan, experiment, point) / "result.json"))]
    command = [*plan.site.config["environment"]["firescale"].split(), "predict", "calibrate",
               "--site", str(plan.site.source), *records, *plan.calibration_options(experiment),
               "--workdir", str(out / "work"), "--out", str(out / CALIBRATION_FILE)]
    return JobSpec(name=_job_name(plan, experiment, "calibration"), ranks=max(p.ranks for p in plan.points[experiment]),
                   walltime_s=parse_walltime(plan.site.default_walltime), command=command, workdir=out,
                   log_file=out / "job.log", status_file=out / "status.json", one_process=True,
                   framework=plan.framework(experiment))   # whose allreduce it probes
