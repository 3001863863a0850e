"""Snapshots: weights, solver history and run state in RUNDIR/snapshots/<prefix>_iter_K.npz, written atomically."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_path
from ..errors import FirescaleError

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
