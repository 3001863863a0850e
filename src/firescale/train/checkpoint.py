"""Snapshots: weights, solver history and run state in RUNDIR/snapshots/<prefix>_iter_K.npz, written atomically.

Each snapshot records the settings that shape the run's trajectory (and their hash); a resume with
other settings is refused with the differences named.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from firescale.atomic import atomic_path
from firescale.errors import FirescaleError

SNAPSHOT_FORMAT = "firescale.train.snapshot/1"
_ANY_SNAPSHOT = re.compile(r"[^/]+_iter_(\d+)\.npz")


@dataclass
class Snapshot:
    """What a resumed run needs: the weights, Caffe's history blobs and the run state (`meta`).

    `meta` holds the iteration, the data-order state (seed and the sample offset into the training
    stream), the initialisation and dropout seeds, the evaluations and time segments so far.
    """

    iteration: int
    weights: dict[str, np.ndarray]
    solver_state: dict[str, np.ndarray]
    meta: dict[str, Any]


def snapshot_path(directory: Path, prefix: str, iteration: int) -> Path:
    return Path(directory) / f"{prefix}_iter_{iteration}.npz"


def write_snapshot(directory: str | Path, prefix: str, snap: Snapshot) -> Path:
    """Write `snap` atomically; returns its path."""
    path = snapshot_path(Path(directory), prefix, snap.iteration)
    arrays: dict[str, np.ndarray] = {f"weights/{k}": v for k, v in snap.weights.items()}
    arrays.update({f"solver/{k}": v for k, v in snap.solver_state.items()})
    meta = {**snap.meta, "iteration": snap.iteration, "format": SNAPSHOT_FORMAT}
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    return path


def read_snapshot(path: str | Path) -> Snapshot:
    """Read a snapshot written by `write_snapshot`."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise FirescaleError(f"cannot read snapshot {path}: {exc}") from None
    if "meta" not in arrays:
        raise FirescaleError(f"snapshot {path} has no 'meta' record; it was not written by firescale train")
    meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
    if meta.get("format") != SNAPSHOT_FORMAT:
        raise FirescaleError(f"snapshot {path}: format {meta.get('format')!r} is not {SNAPSHOT_FORMAT!r}")
    weights = {k[len("weights/"):]: v for k, v in arrays.items() if k.startswith("weights/")}
    solver = {k[len("solver/"):]: v for k, v in arrays.items() if k.startswith("solver/")}
    return Snapshot(int(meta["iteration"]), weights, solver, meta)


def list_snapshots(directory: str | Path, prefix: str) -> list[tuple[int, Path]]:
    """(iteration, path) of every complete snapshot with `prefix`, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    pattern = re.compile(re.escape(prefix) + r"_iter_(\d+)\.npz")
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := pattern.fullmatch(p.name))]
    return sorted(found)


def latest_snapshot(directory: str | Path, prefix: str) -> Path | None:
    """The newest snapshot, or None when there is none."""
    found = list_snapshots(directory, prefix)
    return found[-1][1] if found else None


def newest_snapshot_iteration(directory: str | Path) -> int | None:
    """The highest iteration of any complete snapshot in `directory` (any prefix), or None when there is none."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = [int(m.group(1)) for p in directory.iterdir() if (m := _ANY_SNAPSHOT.fullmatch(p.name))]
    return max(found, default=None)


# Solver keys that change only what is printed or saved, never the weights or the evaluations.
_NOT_TRAJECTORY = ("display", "average_loss", "snapshot", "snapshot_prefix", "snapshot_after_train", "ignored")


def trajectory_settings(*, net: str, dataset_sha256: str, solver: dict[str, Any], batch: dict[str, Any],
                        seed: int, transform: dict[str, Any], target_top1: float | None) -> dict[str, Any]:
    """Every setting that changes a run's trajectory (weights, evaluations, where it stops), as plain JSON."""
    return json.loads(json.dumps({
        "net": net, "dataset_manifest_sha256": dataset_sha256, "seed": seed, "target_top1": target_top1,
        "solver": {k: v for k, v in solver.items() if k not in _NOT_TRAJECTORY},
        "batch": batch, "transform": transform,
    }, sort_keys=True))


def trajectory_digest(settings: dict[str, Any]) -> str:
    """SHA-256 of the settings (recorded in every snapshot)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_same_trajectory(meta: dict[str, Any], settings: dict[str, Any], snapshot: str | Path) -> None:
    """Refuse to resume from a snapshot written with other settings, naming each difference."""
    recorded = meta.get("trajectory")
    if not isinstance(recorded, dict):
        raise FirescaleError(f"snapshot {snapshot} records no training settings (an older firescale wrote it), so "
                             "resuming could silently change the run; train in a new --out folder")
    if meta.get("trajectory_sha256") == trajectory_digest(settings):
        return
    old, new = _flat(recorded), _flat(settings)
    diffs = [f"{key} {old.get(key)!r} there, {new.get(key)!r} now" for key in sorted(set(old) | set(new))
             if old.get(key) != new.get(key)]
    differences = "; ".join(diffs) or "its hash differs"
    raise FirescaleError(f"snapshot {snapshot} was written with other settings ({differences}); "
                         "resume only with the settings it was written with, or train in a new --out folder")
