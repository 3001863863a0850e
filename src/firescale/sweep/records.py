"""The sweep's two records that cross files: a point (written by `site render`) and its run (by `sweep run`)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json, load_json
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK
from firescale.results import TrainResult, result_from_dict
from firescale.sweep.points import POINT_NAME, lr_label

POINT_FORMAT = "firescale.sweep.point/1"
RUN_FORMAT = "firescale.sweep.run/1"
RUN_FILE = "result.json"
OUTCOMES = ("succeeded", "failed")


def name_mismatch(name: str, gpus: int, batch: int, lr: float, repeat: int, baseline: bool) -> str:
    """Why the point name `name` disagrees with its keys ('' when it agrees)."""
    m = POINT_NAME.match(name)
    if m is None:
        return "is not a point name (baseline, baseline-r1, g2-b128-r0, g32-b1024-lr0.08-r0)"
    if baseline:
        expected = "baseline" if repeat == 0 else f"baseline-r{repeat}"
        return "" if name == expected else f"but baseline and repeat name it {expected!r}"
    named = (m["gpus"], m["batch"], m["repeat"])
    if m["gpus"] is None or tuple(map(int, named)) != (gpus, batch, repeat):
        return f"but gpus {gpus}, batch {batch}, repeat {repeat} and baseline {baseline} disagree with it"
    if m["lr"] is not None and float(m["lr"]) != float(lr_label(lr)):
        return f"but its learning rate {m['lr']} is not key 'lr' {lr!r}"
    return ""


@dataclass
class PlannedPoint:
    """What both records say of the point as the plan made it: where, which, and its repeat."""

    site: str
    experiment: str
    point: str
    gpus: int
    nodes: int
    batch: int
    lr: float
    repeat: int
    baseline: bool


@dataclass
class PointRecord(PlannedPoint):
    """What `firescale sweep run` needs to know of a point besides its job script (jobs/<point>.json)."""

    walltime: str
    run_dir: str
    max_resubmits: int
    framework: str = DEFAULT_FRAMEWORK   # the walltime signal differs where NCCL runs (SiteProfile.walltime_signal)
    stall_after: float | None = None   # the experiment's or site's; None: from the point's prediction; 0: no watch
    format: str = POINT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.to_dict())


# Keys a point file written before them lacks: their defaults hold (TensorFlow; stall_after from the prediction).
_POINT_OPTIONAL = ("framework", "stall_after")


def read_point_record(path: str | Path) -> PointRecord:
    """Read jobs/<point>.json; a missing file or key is one sentence naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FirescaleError(f"{path}: no such point file; render the point first (`firescale site render`)")
    data = load_json(path, "point file")
    if not isinstance(data, dict) or data.get("format") != POINT_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise FirescaleError(f"{path}: key 'format' is {found!r}, not {POINT_FORMAT!r}; render the point again")
    names = [f.name for f in fields(PointRecord)]
    missing = [n for n in names if n not in data and n not in _POINT_OPTIONAL]
    if missing:
        raise FirescaleError(f"{path}: missing key {missing[0]!r}; a {POINT_FORMAT} record needs {', '.join(names)}")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise FirescaleError(f"{path}: unknown key {unknown[0]!r}; a {POINT_FORMAT} record has {', '.join(names)}")
    return PointRecord(**data)


_REQUIRED = ("format", "experiment", "point", "gpus", "nodes", "batch", "lr", "repeat", "baseline",
             "outcome", "reason")


@dataclass
class RunRecord(PlannedPoint):
    """One sweep point as the workflow recorded it: what was asked, how the job went, what training gave."""

    outcome: str                     # succeeded | failed | missing (no record where one was expected)
    reason: str
    log_tail: str = ""
    queue_s: float | None = None
    submissions: list[dict[str, Any]] = field(default_factory=list)
    train: TrainResult | None = None
    status: dict[str, Any] | None = None
    source: str = ""

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"

    @property
    def group(self) -> str:
        """The name shared by the repeats of one point: 'baseline', 'g2-b128' or 'g32-b1024-lr0.08'."""
        return "baseline" if self.baseline else re.sub(r"-r\d+$", "", self.point)

    @property
    def lr_swept(self) -> bool:
        """Whether the point is one rate of a learning-rate search (its name carries the rate)."""
        return "-lr" in self.point

    @property
    def scheduler_states(self) -> list[str]:
        """The scheduler's final state of every submission, in order."""
        return [str(s.get("state") or "unknown") for s in self.submissions]

    @property
    def exit_code(self) -> int | None:
        return self.submissions[-1].get("exit_code") if self.submissions else None


def write_run_record(path: str | Path, point: PointRecord, outcome: str, reason: str, *, log_tail: str,
                     submissions: list[dict[str, Any]], train: dict[str, Any] | None,
                     status: dict[str, Any] | None) -> dict[str, Any]:
    """Write a point's run record atomically: the point as planned, the outcome, and the trainer's
    result.json as it wrote it (`train`, read back into a TrainResult by `read_run_record`)."""
    record = {
        "format": RUN_FORMAT,
        **{f.name: getattr(point, f.name) for f in fields(PlannedPoint)},
        "outcome": outcome,
        "reason": reason,
        "log_tail": log_tail,
        "queue_s": sum(s.get("queue_s") or 0.0 for s in submissions),
        "submissions": submissions,
        "train": train,
        "status": status,
    }
    atomic_write_json(path, record)
    return record


def run_record_from_dict(data: Any, where: str) -> RunRecord:
    """Check one run record's keys and types and build it; errors name the file and the key."""
    if not isinstance(data, dict):
        raise FirescaleError(f"{where}: a run record must be a JSON object, found {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise FirescaleError(f"{where}: missing key {missing[0]!r}; a {RUN_FORMAT} record needs {', '.join(_REQUIRED)}")
    if data["format"] != RUN_FORMAT:
        raise FirescaleError(f"{where}: key 'format' is {data['format']!r}; this report reads {RUN_FORMAT!r}")
    if data["outcome"] not in OUTCOMES:
        raise FirescaleError(f"{where}: key 'outcome' is {data['outcome']!r}; allowed: {', '.join(OUTCOMES)}")
    for key in ("gpus", "nodes", "batch", "repeat"):
        if not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < 0:
            raise FirescaleError(f"{where}: key {key!r} must be a non-negative integer, found {data[key]!r}")
    if data["gpus"] < 1 or data["batch"] < 1:
        raise FirescaleError(f"{where}: keys 'gpus' and 'batch' must be at least 1")
    if not isinstance(data["lr"], (int, float)) or isinstance(data["lr"], bool):
        raise FirescaleError(f"{where}: key 'lr' must be a number, found {data['lr']!r}")
    why = name_mismatch(str(data["point"]), data["gpus"], data["batch"], data["lr"], data["repeat"],
                        bool(data["baseline"]))
    if why:
        raise FirescaleError(f"{where}: key 'point' is {data['point']!r} {why}")
    train = None
    if data.get("train") is not None:
        train = result_from_dict(data["train"], f"{where} train")
    if data["outcome"] == "succeeded" and train is None:
        raise FirescaleError(f"{where}: outcome is 'succeeded' but key 'train' holds no training result")
    if data["outcome"] == "succeeded" and train is not None and not train.evals:
        raise FirescaleError(f"{where}: outcome is 'succeeded' but the training result has no evaluations")
    submissions = data.get("submissions") or []
    if not isinstance(submissions, list) or not all(isinstance(s, dict) for s in submissions):
        raise FirescaleError(f"{where}: key 'submissions' must be a list of objects")
    status = data.get("status")
    if status is not None and not isinstance(status, dict):
        raise FirescaleError(f"{where}: key 'status' must be an object or null")
    return RunRecord(
        point=data["point"], experiment=str(data["experiment"]), site=str(data.get("site", "")),
        gpus=data["gpus"], nodes=data["nodes"], batch=data["batch"], lr=float(data["lr"]),
        repeat=data["repeat"], baseline=bool(data["baseline"]), outcome=data["outcome"],
        reason=str(data.get("reason") or ""), log_tail=str(data.get("log_tail") or ""),
        queue_s=data.get("queue_s"), submissions=submissions, train=train, status=status, source=where)


def read_run_record(path: str | Path) -> RunRecord:
    """Read one RESULTS/<point>/result.json."""
    return run_record_from_dict(load_json(path, "run record"), str(path))
