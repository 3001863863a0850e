"""Caffe's solver state (SolverState): iteration, the weights file, history blobs; binary protobuf or HDF5."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from firescale.atomic import atomic_path
from firescale.caffe.caffemodel import blob_array, blob_bytes, h5_blob, is_hdf5, parse_message
from firescale.caffe.proto import SolverState
from firescale.caffe.wire import length_delimited
from firescale.errors import FirescaleError
from firescale.hdf5errors import H5_ERRORS, damaged


@dataclass
class CaffeSolverState:
    """What Caffe's SGDSolver snapshots: `iter`, `learned_net` (the .caffemodel's path as written),
    `history` (one blob per learnable parameter, a second set for AdaDelta and Adam) and `current_step`."""

    iter: int
    learned_net: str
    history: list[np.ndarray]
    current_step: int = 0


def write_solverstate(path: str | Path, state: CaffeSolverState) -> Path:
    """Write a binary SolverState atomically, as SnapshotSolverStateToBinaryProto does."""
    message = SolverState(iter=state.iter, learned_net=state.learned_net, current_step=state.current_step)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(message.SerializeToString())
        for array in state.history:
            fh.write(length_delimited(3, blob_bytes(array)))
    return Path(path)


def write_solverstate_h5(path: str | Path, state: CaffeSolverState) -> Path:
    """Write Caffe's HDF5 solver state atomically: iter, learned_net, current_step and history/<i>."""
    import h5py

    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as fh:
            fh.create_dataset("iter", data=np.array([state.iter], dtype=np.int32))
            # H5LTmake_dataset_string: a scalar, fixed-length, NUL-terminated string
            text = state.learned_net.encode("utf-8")
            fh.create_dataset("learned_net", data=np.array(text, dtype=f"S{len(text) + 1}"))
            fh.create_dataset("current_step", data=np.array([state.current_step], dtype=np.int32))
            history = fh.create_group("history")
            for i, array in enumerate(state.history):
                history.create_dataset(str(i), data=array)
    return Path(path)


def read_solverstate(path: str | Path) -> CaffeSolverState:
    """A solver state in either format (HDF5 told apart by its signature)."""
    path = Path(path)
    if is_hdf5(path):
        return _read_h5(path)
    message = parse_message(SolverState(), path, "SolverState (.solverstate)")
    if not message.HasField("iter"):
        raise FirescaleError(f"{path} records no iteration: it is not a Caffe SolverState (.solverstate)")
    history = [blob_array(b, f"{path}: history blob {i}") for i, b in enumerate(message.history)]
    learned = message.learned_net
    if isinstance(learned, bytes):   # protobuf hands a string field that is not UTF-8 over as bytes
        try:
            learned = learned.decode("utf-8")
        except UnicodeDecodeError:
            raise FirescaleError(f"{path}: learned_net is not UTF-8 text; expected the weights file's name") from None
    return CaffeSolverState(message.iter, learned, history, message.current_step)


def _read_h5(path: Path) -> CaffeSolverState:
    import h5py

    try:
        with h5py.File(path, "r") as fh:
            missing = [key for key in ("iter", "current_step", "history") if key not in fh]
            if missing:
                raise FirescaleError(f"{path} has no {missing[0]!r}: it is not Caffe's HDF5 solver state "
                                     "(.solverstate.h5)")
            group = fh["history"]
            if not isinstance(group, h5py.Group) or sorted(group) != sorted(str(i) for i in range(len(group))):
                raise FirescaleError(f"{path}: 'history' is not a group of Caffe's history blobs 0, 1, ...")
            history = [h5_blob(group[str(i)], f"{path}: history/{i}") for i in range(len(group))]
            return CaffeSolverState(_h5_count(fh, "iter", path), _h5_text(fh, "learned_net", path), history,
                                    _h5_count(fh, "current_step", path))
    except H5_ERRORS as exc:
        raise damaged(path, "(Caffe's HDF5 solver state)", exc) from None


def _h5_count(fh, key: str, path: Path) -> int:
    """A whole number Caffe stores as a one-element int dataset (H5LTmake_dataset_int)."""
    value = np.asarray(fh[key][()])
    if value.size != 1 or value.dtype.kind not in "iu":
        raise FirescaleError(f"{path}: {key!r} holds {value.dtype} of shape {value.shape}; expected one whole number")
    return int(value.reshape(-1)[0])


def _h5_text(fh, key: str, path: Path) -> str:
    """A string Caffe stores with H5LTmake_dataset_string (absent: empty)."""
    if key not in fh:
        return ""
    value = fh[key][()]
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8").rstrip("\0")
        except UnicodeDecodeError:
            raise FirescaleError(f"{path}: {key!r} is not UTF-8 text") from None
    if isinstance(value, str):
        return value
    raise FirescaleError(f"{path}: {key!r} holds {type(value).__name__}; expected the weights file's name as text")
