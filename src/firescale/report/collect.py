"""Read the sweep's run records (RESULTS/<point>/result.json) into checked RunRecord objects."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import load_json
from ..errors import FirescaleError
from ..results import TrainResult, result_from_dict

RUN_FORMAT = "firescale.sweep.run/1"
RUN_FILE = "result.json"
OUTCOMES = ("succeeded", "failed")
POINT_NAME = re.compile(r"baseline|g\d+-b\d+-r\d+")
_REQUIRED = ("format", "experiment", "point", "gpus", "nodes", "batch", "lr", "repeat", "baseline",
             "outcome", "reason")


@dataclass
class RunRecord:
    """One sweep point as the workflow recorded it: what was asked, how the job went, what training gave."""

    point: str
    experiment: str
    site: str
    gpus: int
    nodes: int
    batch: int
    lr: float
    repeat: int
    baseline: bool
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
        """The name shared by the repeats of one point: 'baseline' or 'g{gpus}-b{batch}'."""
        return "baseline" if self.baseline else f"g{self.gpus}-b{self.batch}"

    @property
    def scheduler_states(self) -> list[str]:
        """The scheduler's final state of every submission, in order."""
        return [str(s.get("state") or "unknown") for s in self.submissions]

    @property
    def exit_code(self) -> int | None:
        return self.submissions[-1].get("exit_code") if self.submissions else None


def expected_point_name(gpus: int, batch: int, repeat: int, baseline: bool) -> str:
    return "baseline" if baseline else f"g{gpus}-b{batch}-r{repeat}"


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
    name = expected_point_name(data["gpus"], data["batch"], data["repeat"], bool(data["baseline"]))
    if data["point"] != name:
        raise FirescaleError(f"{where}: key 'point' is {data['point']!r} but gpus, batch, repeat and baseline "
                             f"name it {name!r}")
    train = None
    if data.get("train") is not None:
        train = result_from_dict(data["train"], f"{where} train")
    if data["outcome"] == "succeeded" and train is None:
        raise FirescaleError(f"{where}: outcome is 'succeeded' but key 'train' holds no training result")
    if data["outcome"] == "succeeded" and not train.evals:
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


def missing_record(point: Any, site: str, nodes: int, where: Path) -> RunRecord:
    """A placeholder for a planned point that has no record, so that its row says so."""
    return RunRecord(point=point.name, experiment=point.experiment, site=site, gpus=point.gpus, nodes=nodes,
                     batch=point.batch, lr=point.lr, repeat=point.repeat, baseline=point.baseline,
                     outcome="missing", reason=f"no run record at {where}", source=str(where))


def collect_runs(results: str | Path, experiment: str) -> list[RunRecord]:
    """Every run record under `results` (one folder per point), checked to belong to `experiment`.

    A folder named like a point (baseline, g2-b64-r0) without a result.json is an error; other
    folders (logs, snapshots) are not points and are left alone.
    """
    results = Path(results)
    if not results.is_dir():
        raise FirescaleError(f"results folder {results} does not exist")
    records = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir() and POINT_NAME.fullmatch(p.name)):
        path = folder / RUN_FILE
        if not path.is_file():
            raise FirescaleError(f"{folder}: a sweep point folder without its {RUN_FILE}")
        record = read_run_record(path)
        if record.point != folder.name:
            raise FirescaleError(f"{path}: key 'point' is {record.point!r} but the record sits in folder {folder.name!r}")
        if record.experiment != experiment:
            raise FirescaleError(f"{path}: key 'experiment' is {record.experiment!r}, not {experiment!r}; "
                                 f"keep one experiment's records per results folder")
        records.append(record)
    if not records:
        raise FirescaleError(f"results folder {results} holds no run records (<point>/{RUN_FILE})")
    return records
