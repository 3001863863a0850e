"""One stored run: a sweep's run record with the columns a comparison selects on, and its identity."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, from_versions
from firescale.sweep.records import RunRecord, run_record_from_dict

# Keys of a run record that say where it was read, not what ran: left out of its identity.
_NOT_IDENTITY = ("source",)
# What the trainer's `versions` holds that is not a version.
_NOT_VERSIONS = ("hostname",)


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(data: Any) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def run_key(record: dict[str, Any]) -> str:
    """A run's identity: the digest of its record as written, wherever the record now lies."""
    return digest({k: v for k, v in record.items() if k not in _NOT_IDENTITY})


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _utc(text: str) -> str | None:
    """A scheduler's or the trainer's time stamp as ISO 8601 UTC; None when it does not parse."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.astimezone()    # a local time, as Slurm and the local scheduler write them
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def finished_at(record: RunRecord, added_at: str) -> str:
    """When the run ended: its last submission's end, else when it was added."""
    for submission in reversed(record.submissions):
        ended = submission.get("ended")
        if ended and (when := _utc(str(ended))):
            return when
    return added_at


def run_framework(versions: dict[str, str], context: RunContext) -> str:
    """The backend that trained, as its record says (`versions`), else as the experiment says, else the
    framework whose version it recorded (records from before runs named their backend; TensorFlow's, the only
    backend then, where it recorded neither)."""
    if versions.get("framework"):
        return versions["framework"]
    if context.framework:
        return context.framework
    recorded = from_versions(versions)
    return recorded.name if recorded else DEFAULT_FRAMEWORK if versions else "unknown"


def run_precision(versions: dict[str, str], context: RunContext) -> str:
    """The arithmetic it trained in, as its record says, else as the experiment says, else fp32 (the
    trainer's only arithmetic before precisions were recorded)."""
    return versions.get("precision") or context.precision or ("fp32" if versions else "unknown")


@dataclass(frozen=True)
class RunContext:
    """What a run's record does not say and the caller knows: the sweep it was added with."""

    commit: str = "unknown"
    dirty: bool | None = None
    hardware: str = ""
    tolerance: float | None = None
    predictions: dict[str, dict[str, float]] = field(default_factory=dict)   # keyed as report rows are
    framework: str | None = None     # the experiment's, for records whose versions do not say
    precision: str | None = None


@dataclass(frozen=True)
class StoredRun:
    """A run as the store keeps it (store/schema.py `runs`), with its whole record."""

    run_key: str
    site: str
    experiment: str
    point: str
    group: str
    baseline: bool
    gpus: int
    nodes: int
    batch: int
    lr: float
    repeat: int
    net: str
    dataset_sha256: str
    framework: str
    precision: str
    hardware: str
    commit: str
    dirty: bool | None
    versions: dict[str, str]
    versions_digest: str
    outcome: str
    finished_at: str
    added_at: str
    record: dict[str, Any]
    train_time_s: float | None = None
    tta_s: float | None = None
    iteration_s: float | None = None
    data_wait_s: float | None = None
    compute_s: float | None = None
    allreduce_s: float | None = None
    top1: float | None = None
    top5: float | None = None
    epochs: float | None = None
    predicted_iteration_s: float | None = None
    predicted_tta_s: float | None = None
    tolerance: float | None = None
    sweeps: tuple[str, ...] = ()   # the keys of the sweeps that hold it (a resumed sweep shares runs)
    tags: tuple[str, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"

    def run_record(self) -> RunRecord:
        return run_record_from_dict(self.record, f"stored run {self.site}/{self.experiment}/{self.point}")

    def row(self) -> dict[str, Any]:
        """The `runs` table's columns (sweep_id left to the caller)."""
        out = {name: getattr(self, name) for name in _ROW_FIELDS}
        out["grp"] = self.group
        out["versions"] = canonical_json(self.versions)
        out["record"] = canonical_json(self.record)
        return out


_ROW_FIELDS = ("run_key", "site", "experiment", "point", "baseline", "gpus", "nodes", "batch", "lr", "repeat",
               "net", "dataset_sha256", "framework", "precision", "hardware", "commit", "dirty", "versions_digest",
               "outcome", "finished_at", "added_at", "train_time_s", "tta_s", "iteration_s", "data_wait_s",
               "compute_s", "allreduce_s", "top1", "top5", "epochs", "predicted_iteration_s", "predicted_tta_s")


def stored_run(raw: dict[str, Any], context: RunContext, *, where: str, added_at: str | None = None) -> StoredRun:
    """A stored run from a run record as written (`raw`), checked as the report checks it."""
    record = run_record_from_dict(raw, where)
    if record.outcome == "missing":
        raise FirescaleError(f"{where}: a placeholder for a missing run is not a run to store")
    added = added_at or utc_now()
    train = record.train
    versions = {k: str(v) for k, v in sorted((train.versions if train else {}).items())
                if k not in _NOT_VERSIONS and v is not None}
    framework, precision = run_framework(versions, context), run_precision(versions, context)
    metrics: dict[str, Any] = {}
    if record.succeeded and train is not None:
        from firescale.report.summary import run_metrics

        m = run_metrics(record)
        metrics = {"train_time_s": m.time_s, "tta_s": m.tta_s, "iteration_s": m.iteration_s,
                   "data_wait_s": m.data_wait_s, "compute_s": m.compute_s, "allreduce_s": m.allreduce_s,
                   "top1": m.top1, "top5": m.top5, "epochs": m.epochs}
    predicted = context.predictions.get(record.group) or context.predictions.get(f"g{record.gpus}-b{record.batch}")
    if record.baseline:
        predicted = context.predictions.get("baseline")
    return StoredRun(
        run_key=run_key(raw), site=record.site, experiment=record.experiment, point=record.point,
        group=record.group, baseline=record.baseline, gpus=record.gpus, nodes=record.nodes, batch=record.batch,
        lr=record.lr, repeat=record.repeat, net=train.net if train else "", dataset_sha256=(
            train.dataset_manifest_sha256 if train else ""), framework=framework, precision=precision,
        hardware=context.hardware, commit=versions.get("commit", context.commit), dirty=context.dirty,
        versions=versions, versions_digest=digest({k: v for k, v in versions.items() if k != "commit"}),
        outcome=record.outcome, finished_at=finished_at(record, added), added_at=added,
        record={k: v for k, v in raw.items() if k not in _NOT_IDENTITY},
        predicted_iteration_s=predicted.get("iteration_s") if predicted else None,
        predicted_tta_s=predicted.get("time_to_accuracy_s") if predicted else None,
        tolerance=context.tolerance, **metrics)


def from_row(row: Any, tags: tuple[str, ...] = (), sweeps: tuple[str, ...] = (),
             tolerance: float | None = None) -> StoredRun:
    """A StoredRun from a `runs` row read back."""
    m = row._mapping
    values = {name: m[name] for name in _ROW_FIELDS}
    values["baseline"] = bool(values["baseline"])
    return StoredRun(group=m["grp"], versions=json.loads(m["versions"]), record=json.loads(m["record"]),
                     tags=tags, sweeps=sweeps, tolerance=tolerance, **values)
