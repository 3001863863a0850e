"""Snapshots as Caffe writes them, plus firescale's run state beside them, in RUNDIR/snapshots/.

Each snapshot is three files, each written atomically and the run state last, so a snapshot is
complete exactly when its run state exists:

- `<prefix>_iter_K.caffemodel` and `<prefix>_iter_K.solverstate` (snapshot_format BINARYPROTO,
  Caffe's default) or `.caffemodel.h5` and `.solverstate.h5` (HDF5): Caffe's own files, in Caffe's
  layouts, which Caffe can resume or fine-tune from;
- `<prefix>_iter_K.firescale.json`: what Caffe does not keep and an exact resume needs (the data-order
  state, the seeds, evaluations, time segments) and the settings that shape the run's trajectory
  (and their hash); a resume with other settings is refused with the differences named.

Snapshots of older firescale versions (`<prefix>_iter_K.npz`) are still read, so a run started
before can be resumed; new snapshots are always Caffe's.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from firescale.atomic import atomic_write_json, load_json
from firescale.caffe.caffemodel import read_weights, write_caffemodel, write_caffemodel_h5
from firescale.caffe.solverstate import CaffeSolverState, read_solverstate, write_solverstate, write_solverstate_h5
from firescale.errors import FirescaleError
from firescale.nets.spec import NetSpec
from firescale.train.caffe_weights import (
    BlobLayout,
    caffe_layouts,
    from_caffe,
    layer_types,
    net_from_caffe,
    net_to_caffe,
    to_caffe,
)

if TYPE_CHECKING:
    from firescale.train.params import ParamInfo

SNAPSHOT_FORMAT = "firescale.train.snapshot/2"
NPZ_FORMAT = "firescale.train.snapshot/1"
RUN_STATE = ".firescale.json"
# snapshot_format -> (weights suffix, solver-state suffix), as Caffe names them
SUFFIXES = {"BINARYPROTO": (".caffemodel", ".solverstate"), "HDF5": (".caffemodel.h5", ".solverstate.h5")}
_ANY_SNAPSHOT = re.compile(r"[^/]+_iter_(\d+)(?:\.firescale\.json|\.npz)")


@dataclass
class Snapshot:
    """What a resumed run needs: the weights and Caffe's history blobs (in the trainer's layout, by
    parameter name) and the run state (`meta`).

    `meta` holds the iteration, the data-order state (seed and the sample offset into the training
    stream), the initialisation and dropout seeds, the evaluations and time segments so far.
    """

    iteration: int
    weights: dict[str, np.ndarray]
    solver_state: dict[str, np.ndarray]
    meta: dict[str, Any]


def snapshot_stem(directory: Path, prefix: str, iteration: int) -> Path:
    """RUNDIR/snapshots/<prefix>_iter_K, the name every file of the snapshot starts with."""
    return Path(directory) / f"{prefix}_iter_{iteration}"


def _caffe_history(snap: Snapshot, layouts: list[BlobLayout]) -> list[np.ndarray]:
    """The history blobs in Caffe's history_ order and layouts: one per learnable parameter, in the net's
    order, then AdaDelta's or Adam's second set."""
    state = snap.solver_state
    first = [to_caffe(b, state[f"history/{b.param}"]) for b in layouts]
    second = [to_caffe(b, state[f"update_history/{b.param}"]) for b in layouts
              if f"update_history/{b.param}" in state]
    return first + second


def write_snapshot(directory: str | Path, prefix: str, snap: Snapshot, spec: NetSpec, *,
                   snapshot_format: str = "BINARYPROTO", current_step: int = 0) -> Path:
    """Write `snap` as Caffe's two files in `snapshot_format`, then its run state; returns the run state's path."""
    stem = snapshot_stem(Path(directory), prefix, snap.iteration)
    model_suffix, state_suffix = SUFFIXES[snapshot_format]
    model, state = Path(f"{stem}{model_suffix}"), Path(f"{stem}{state_suffix}")
    blobs = net_to_caffe(spec, snap.weights)
    if snapshot_format == "HDF5":
        write_caffemodel_h5(model, blobs)
    else:
        write_caffemodel(model, blobs, spec.name, layer_types(spec))
    layouts = [b for blobs_ in caffe_layouts(spec).values() for b in blobs_]
    solver_state = CaffeSolverState(snap.iteration, str(model), _caffe_history(snap, layouts), current_step)
    (write_solverstate_h5 if snapshot_format == "HDF5" else write_solverstate)(state, solver_state)
    meta = {**snap.meta, "iteration": snap.iteration, "format": SNAPSHOT_FORMAT,
            "snapshot_format": snapshot_format, "caffemodel": model.name, "solverstate": state.name}
    return atomic_write_json(Path(f"{stem}{RUN_STATE}"), meta)


def run_state_path(path: str | Path) -> Path:
    """The run state of a snapshot named by any of its files (.solverstate[.h5], .caffemodel[.h5], .firescale.json)."""
    path = Path(path)
    name = path.name
    for suffix in (RUN_STATE, *SUFFIXES["HDF5"], *SUFFIXES["BINARYPROTO"]):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)] + RUN_STATE)
    raise FirescaleError(f"snapshot {path}: name a Caffe solver state (<prefix>_iter_K.solverstate or "
                         ".solverstate.h5) written by firescale train")


def read_snapshot(path: str | Path, spec: NetSpec) -> Snapshot:
    """Read a snapshot named by any of its files (or an older firescale's .npz) for the net `spec`."""
    path = Path(path)
    if not path.is_file():
        raise FirescaleError(f"snapshot {path} does not exist; name a <prefix>_iter_K.solverstate (or "
                             ".solverstate.h5) that firescale train wrote")
    if path.suffix == ".npz":
        return _read_npz(path)
    run_state = run_state_path(path)
    if not run_state.is_file():
        raise FirescaleError(f"snapshot {path} has no firescale run state {run_state.name} beside it (data order, "
                             "seeds, evaluations), so it cannot be resumed exactly; to start from its weights "
                             "instead, give the .caffemodel as --weights")
    meta = load_json(run_state, "snapshot run state")
    if not isinstance(meta, dict) or meta.get("format") != SNAPSHOT_FORMAT:
        raise FirescaleError(f"snapshot run state {run_state}: format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r} is not {SNAPSHOT_FORMAT!r}")
    state_file = run_state.with_name(str(meta["solverstate"]))
    state = read_solverstate(state_file)
    if state.iter != int(meta["iteration"]):
        raise FirescaleError(f"{state_file} is at iteration {state.iter} but its run state {run_state.name} at "
                             f"{meta['iteration']}: the snapshot's files do not belong together")
    model = _learned_net(state_file, state.learned_net)
    copied = net_from_caffe(spec, read_weights(model), model)
    if copied.kept:
        raise FirescaleError(f"snapshot weights {model} have no layer {copied.kept[0]!r} of net {spec.name!r}")
    layouts = [b for blobs in caffe_layouts(spec).values() for b in blobs]
    n = len(layouts)
    if len(state.history) not in (n, 2 * n):
        raise FirescaleError(f"{state_file} holds {len(state.history)} history blobs, but net {spec.name!r} has {n} "
                             f"parameters (expected {n}, or {2 * n} for AdaDelta and Adam)")
    solver: dict[str, np.ndarray] = {}
    for i, array in enumerate(state.history):
        layout = layouts[i % n]
        if tuple(array.shape) != layout.caffe_shape:
            raise FirescaleError(f"{state_file}: history blob {i} has shape {tuple(array.shape)}, but parameter "
                                 f"{layout.param} of net {spec.name!r} expects {layout.caffe_shape}")
        solver[f"{'history' if i < n else 'update_history'}/{layout.param}"] = from_caffe(layout, array)
    return Snapshot(state.iter, copied.weights, solver, meta)


def _learned_net(state_file: Path, learned_net: str) -> Path:
    """The solver state's weights file: beside it (a moved run folder), else as written (Caffe: from the cwd)."""
    if not learned_net:
        raise FirescaleError(f"{state_file} names no learned_net (its .caffemodel)")
    beside, as_written = state_file.with_name(Path(learned_net).name), Path(learned_net)
    for candidate in (beside, as_written):
        if candidate.is_file():
            return candidate
    raise FirescaleError(f"{state_file}: its weights file {learned_net} is missing (looked for {beside} too)")


def _read_npz(path: Path) -> Snapshot:
    """A snapshot of an older firescale: weights, solver history and run state in one .npz."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise FirescaleError(f"cannot read snapshot {path}: {exc}") from None
    if "meta" not in arrays:
        raise FirescaleError(f"snapshot {path} has no 'meta' record; it was not written by firescale train")
    meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
    if meta.get("format") != NPZ_FORMAT:
        raise FirescaleError(f"snapshot {path}: format {meta.get('format')!r} is not {NPZ_FORMAT!r}")
    weights = {k[len("weights/"):]: v for k, v in arrays.items() if k.startswith("weights/")}
    solver = {k[len("solver/"):]: v for k, v in arrays.items() if k.startswith("solver/")}
    return Snapshot(int(meta["iteration"]), weights, solver, meta)


def list_snapshots(directory: str | Path, prefix: str) -> list[tuple[int, Path]]:
    """(iteration, path) of every complete snapshot with `prefix`, oldest first: its run state, or an older .npz."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    pattern = re.compile(re.escape(prefix) + r"_iter_(\d+)(\.firescale\.json|\.npz)")
    found: dict[int, Path] = {}
    for p in directory.iterdir():
        if m := pattern.fullmatch(p.name):
            it = int(m.group(1))
            if m.group(2) != ".npz" or it not in found:  # Caffe's files win over an older .npz
                found[it] = p
    return sorted(found.items())


def latest_snapshot(directory: str | Path, prefix: str) -> Path | None:
    """The newest complete snapshot (its .solverstate, as Caffe's --snapshot names it), or None when there is none."""
    found = list_snapshots(directory, prefix)
    if not found:
        return None
    path = found[-1][1]
    if path.suffix == ".npz":
        return path
    meta = load_json(path, "snapshot run state")
    return path.with_name(str(meta["solverstate"])) if isinstance(meta, dict) and "solverstate" in meta else path


def newest_snapshot_iteration(directory: str | Path) -> int | None:
    """The highest iteration of any complete snapshot in `directory` (any prefix), or None when there is none."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = [int(m.group(1)) for p in directory.iterdir() if (m := _ANY_SNAPSHOT.fullmatch(p.name))]
    return max(found, default=None)


def check_caffe_layout(spec: NetSpec, infos: list[ParamInfo]) -> None:
    """Snapshots and --weights need every parameter of the net in Caffe's layouts: refuse a net with one that
    `train/caffe_weights.py` does not lay out (a layer kind added to the trainer but not there)."""
    ours = {info.name: tuple(info.shape) for info in infos}
    caffe = {b.param: b.trainer_shape for blobs in caffe_layouts(spec).values() for b in blobs}
    if ours != caffe:
        name = sorted(set(ours.items()) ^ set(caffe.items()))[0][0]
        raise FirescaleError(f"net {spec.name!r}: parameter {name!r} has no Caffe layout in firescale.train."
                             "caffe_weights, so its snapshots could not be written as Caffe's")


def weights_file_record(path: Path) -> dict[str, str]:
    """The --weights file as the trajectory names it: its file name and SHA-256."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise FirescaleError(f"cannot read --weights {path}: {exc.strerror}") from None
    return {"file": path.name, "sha256": digest.hexdigest()}


# Solver keys that change only what is printed or saved, never the weights or the evaluations.
_NOT_TRAJECTORY = ("display", "average_loss", "snapshot", "snapshot_prefix", "snapshot_after_train",
                   "snapshot_format", "ignored")


def trajectory_settings(*, net: str, dataset_sha256: str, solver: dict[str, Any], batch: dict[str, Any],
                        seed: int, transform: dict[str, Any], target_top1: float | None,
                        weights: dict[str, Any] | None = None, net_sha256: str | None = None) -> dict[str, Any]:
    """Every setting that changes a run's trajectory (weights, evaluations, where it stops), as plain JSON;
    `weights` (the --weights file's name and SHA-256) only when the run started from Caffe's weights;
    `net_sha256` (the Caffe net file's SHA-256) only for a net read from a file, so an edited file is refused."""
    settings = {
        "net": net, "dataset_manifest_sha256": dataset_sha256, "seed": seed, "target_top1": target_top1,
        "solver": {k: v for k, v in solver.items() if k not in _NOT_TRAJECTORY},
        "batch": batch, "transform": transform,
    }
    if weights is not None:
        settings["weights"] = weights
    if net_sha256 is not None:
        settings["net_sha256"] = net_sha256
    return json.loads(json.dumps(settings, sort_keys=True))


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


def _with_limit(limit: float | None) -> str:
    return "without --read-limit-mbs" if limit is None else f"with --read-limit-mbs {limit:g}"


def check_same_read_limit(meta: dict[str, Any], read_limit_mbs: float | None, snapshot: str | Path) -> None:
    """Refuse to resume under another --read-limit-mbs than the snapshot's run had: the weights would be the
    same, but the run's times would mix two storage speeds under one record."""
    before = meta.get("read_limit_mbs")
    if before != read_limit_mbs:
        raise FirescaleError(f"snapshot {snapshot} was written by a run {_with_limit(before)} and this one runs "
                             f"{_with_limit(read_limit_mbs)}; resume with the read limit it had, so that its times "
                             "are those of one storage speed, or train in a new --out folder")
