"""Snapshots as Caffe writes them (.caffemodel + .solverstate, or their HDF5) with firescale's run state beside
them: exact round trips, which snapshot is newest, older .npz snapshots, files that do not belong together."""
from __future__ import annotations

import json

import numpy as np
import pytest

from firescale.caffe.caffemodel import read_weights
from firescale.caffe.lr_policies import current_step
from firescale.caffe.solver import solver_from_mapping
from firescale.caffe.solverstate import read_solverstate
from firescale.errors import FirescaleError
from firescale.nets.zoo import get_net
from firescale.train.caffe_weights import caffe_layouts
from firescale.train.checkpoint import (
    Snapshot,
    latest_snapshot,
    list_snapshots,
    newest_snapshot_iteration,
    read_snapshot,
    write_snapshot,
)

SPEC = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))


def _snapshot(iteration: int, second_history: bool = False) -> Snapshot:
    rng = np.random.default_rng(iteration)
    shapes = {b.param: b.trainer_shape for blobs in caffe_layouts(SPEC).values() for b in blobs}
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    state = {f"history/{name}": rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    if second_history:   # AdaDelta's and Adam's second set of history blobs
        state.update({f"update_history/{n}": rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()})
    return Snapshot(iteration, weights, state, {"seed": 3, "evals": [], "start_sample": 64 * iteration})


def _same(a: Snapshot, b: Snapshot) -> None:
    assert a.iteration == b.iteration and a.weights.keys() == b.weights.keys()
    assert a.solver_state.keys() == b.solver_state.keys()
    for k in a.weights:
        assert a.weights[k].tobytes() == b.weights[k].tobytes(), k
    for k in a.solver_state:
        assert a.solver_state[k].tobytes() == b.solver_state[k].tobytes(), k


@pytest.mark.parametrize("fmt, model, state", [("BINARYPROTO", ".caffemodel", ".solverstate"),
                                               ("HDF5", ".caffemodel.h5", ".solverstate.h5")])
@pytest.mark.parametrize("adam", [False, True])
def test_a_snapshot_is_caffes_two_files_and_reads_back_exactly(tmp_path, fmt, model, state, adam):
    snap = _snapshot(40, second_history=adam)
    run_state = write_snapshot(tmp_path, "lenet", snap, SPEC, snapshot_format=fmt, current_step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"lenet_iter_40{model}", f"lenet_iter_40{state}", "lenet_iter_40.firescale.json"])
    # Caffe's own files, in Caffe's layouts: OIHW kernels, the learned_net named, one history blob per parameter
    blobs = read_weights(tmp_path / f"lenet_iter_40{model}")
    assert blobs["conv2"][0].shape == (50, 20, 5, 5) and blobs["ip1"][0].shape == (500, 200)
    solver = read_solverstate(tmp_path / f"lenet_iter_40{state}")
    assert (solver.iter, solver.current_step) == (40, 2)
    assert solver.learned_net == str(tmp_path / f"lenet_iter_40{model}")
    assert len(solver.history) == 8 * (2 if adam else 1) and solver.history[4].shape == (500, 200)
    assert json.loads(run_state.read_text())["start_sample"] == 64 * 40
    for name in (f"lenet_iter_40{state}", f"lenet_iter_40{model}", run_state.name):  # any of its files names it
        _same(read_snapshot(tmp_path / name, SPEC), snap)


def test_a_moved_run_folder_still_resumes(tmp_path):
    write_snapshot(tmp_path / "a", "lenet", _snapshot(5), SPEC)
    (tmp_path / "a").rename(tmp_path / "b")   # learned_net names a/..., the .caffemodel is now beside it in b/
    _same(read_snapshot(tmp_path / "b" / "lenet_iter_5.solverstate", SPEC), _snapshot(5))


def test_the_newest_complete_snapshot_is_picked(tmp_path):
    for it in (5, 50, 10):
        write_snapshot(tmp_path, "snapshot", _snapshot(it), SPEC)
    # Caffe's files of iteration 99 without the run state (written last) are not a complete snapshot
    (tmp_path / "snapshot_iter_99.caffemodel").write_bytes(b"partial")
    (tmp_path / ".snapshot_iter_99.firescale.json.tmp-x").write_bytes(b"partial")
    assert [it for it, _ in list_snapshots(tmp_path, "snapshot")] == [5, 10, 50]
    latest = latest_snapshot(tmp_path, "snapshot")
    assert latest is not None and latest.name == "snapshot_iter_50.solverstate"
    assert newest_snapshot_iteration(tmp_path) == 50
    assert latest_snapshot(tmp_path / "none", "snapshot") is None


def test_an_older_firescale_npz_snapshot_is_still_read(tmp_path):
    snap = _snapshot(30)
    arrays = {f"weights/{k}": v for k, v in snap.weights.items()}
    arrays.update({f"solver/{k}": v for k, v in snap.solver_state.items()})
    meta = {**snap.meta, "iteration": 30, "format": "firescale.train.snapshot/1"}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "snapshot_iter_30.npz", **arrays)
    write_snapshot(tmp_path, "snapshot", _snapshot(20), SPEC)
    latest = latest_snapshot(tmp_path, "snapshot")
    assert latest is not None and latest.name == "snapshot_iter_30.npz" and newest_snapshot_iteration(tmp_path) == 30
    _same(read_snapshot(latest, SPEC), snap)


def test_a_solver_state_without_run_state_is_refused_saying_what_to_do(tmp_path):
    write_snapshot(tmp_path, "lenet", _snapshot(5), SPEC)
    (tmp_path / "lenet_iter_5.firescale.json").unlink()
    with pytest.raises(FirescaleError, match="lenet_iter_5.solverstate has no firescale run state lenet_iter_5"
                                             ".firescale.json beside it .* give the .caffemodel as --weights"):
        read_snapshot(tmp_path / "lenet_iter_5.solverstate", SPEC)


def test_a_missing_snapshot_is_named(tmp_path):
    with pytest.raises(FirescaleError, match="snapshot .*lenet_iter_5.solverstate does not exist"):
        read_snapshot(tmp_path / "lenet_iter_5.solverstate", SPEC)


def test_files_that_do_not_belong_together_are_refused(tmp_path):
    write_snapshot(tmp_path, "lenet", _snapshot(5), SPEC)
    write_snapshot(tmp_path, "other", _snapshot(6), SPEC)
    (tmp_path / "other_iter_6.solverstate").rename(tmp_path / "lenet_iter_5.solverstate")
    with pytest.raises(FirescaleError, match="is at iteration 6 but its run state lenet_iter_5.firescale.json at 5"):
        read_snapshot(tmp_path / "lenet_iter_5.solverstate", SPEC)
    write_snapshot(tmp_path, "third", _snapshot(7), SPEC)
    bigger = get_net("lenet_same", num_classes=10, input_shape=(12, 12, 1))   # a snapshot of another net
    with pytest.raises(FirescaleError, match=r"third_iter_7.caffemodel: layer 'ip1' blob 0 \(weights\) has shape "
                                             r"\(500, 200\), but net 'lenet_same' expects \(500, 450\)"):
        read_snapshot(tmp_path / "third_iter_7.solverstate", bigger)


def test_current_step_is_caffes():
    step = solver_from_mapping({"base_lr": 0.1, "max_iter": 100, "lr_policy": "step", "gamma": 0.1, "stepsize": 30})
    multi = solver_from_mapping({"base_lr": 0.1, "max_iter": 100, "lr_policy": "multistep", "gamma": 0.1,
                                 "stepvalue": [10, 20]})
    # after N updates the last rate was computed at iteration N - 1
    assert [current_step(step, n) for n in (0, 30, 31, 61)] == [0, 0, 1, 2]
    assert [current_step(multi, n) for n in (10, 11, 21, 99)] == [0, 1, 2, 2]


def test_snapshot_format_is_read_from_the_solver():
    base = {"base_lr": 0.1, "max_iter": 10}
    assert solver_from_mapping(base).snapshot_format == "BINARYPROTO"
    assert solver_from_mapping({**base, "snapshot_format": "HDF5"}).snapshot_format == "HDF5"
    assert solver_from_mapping({**base, "snapshot_format": 0}).snapshot_format == "HDF5"   # the enum's number
    with pytest.raises(FirescaleError, match="'snapshot_format' must be BINARYPROTO or HDF5, not 'NPZ'"):
        solver_from_mapping({**base, "snapshot_format": "NPZ"})
