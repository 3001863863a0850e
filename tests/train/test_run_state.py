"""The run state a snapshot keeps, a resume reads and the run record reports: one to_dict, one from_dict; the
keys a snapshot's run state has always had, and the run states older firescale versions wrote, still read."""
from __future__ import annotations

import pytest

from firescale.errors import FirescaleError
from firescale.results import EvalPoint, Segment
from firescale.train.checkpoint import trajectory_digest, trajectory_settings
from firescale.train.run_state import RunState
from firescale.train.timing import SegmentClock, SplitSums

BATCH = {"ranks": 2, "batch_per_rank": 16, "total_batch": 32, "iter_size": 1, "effective_batch": 32,
         "reference_batch": 32, "lr_scaling": "none", "lr_scale": 1.0, "warmup_iters": 0, "warmup_start_factor": 1.0,
         "warmup_start_lr": None}
TRAJECTORY = trajectory_settings(net="lenet_same", dataset_sha256="abc", solver={"type": "SGD", "base_lr": 0.01},
                                 batch=BATCH, seed=7, transform={"scale": 1 / 255}, target_top1=None)
# The keys of a snapshot's run state before RunState wrote it (train/trainer.py's meta_out), which stay.
SNAPSHOT_KEYS = {"net", "dataset_manifest_sha256", "solver_type", "seed", "data_seed", "start_sample", "dropout_seed",
                 "ranks", "batch", "evals", "segments", "split_sums", "trajectory", "trajectory_sha256",
                 "read_limit_mbs"}


def _running() -> RunState:
    state = RunState(net="lenet_same", dataset_manifest_sha256="abc", solver_type="SGD", ranks=2, batch=BATCH,
                     trajectory=TRAJECTORY, read_limit_mbs=4.0, seed=7, data_seed=7, hostnames=["n1", "n2"])
    state.clock.start_training()
    for _ in range(3):
        state.updated(32)
        state.split.add_whole(0.001, 0.01)
    state.evaluated(0.5, 0.75, 0.9, 1.25, 0.2)
    state.updated(32)
    state.split.add(0.001, 0.008, 0.002)
    return state


def test_the_state_round_trips_and_the_next_segment_starts_where_it_stopped():
    before = _running()
    data = before.to_dict("interrupted")
    assert SNAPSHOT_KEYS <= set(data) and data["iteration"] == 4 and data["start_sample"] == 128
    assert data["trajectory_sha256"] == trajectory_digest(TRAJECTORY) and data["dropout_seed"] == 7
    [segment] = data["segments"]
    assert (segment["start_iter"], segment["end_iter"], segment["images"], segment["status"]) == (0, 4, 128,
                                                                                                  "interrupted")
    assert segment["eval_s"] == pytest.approx(0.2) and segment["hostnames"] == ["n1", "n2"]
    clock = SegmentClock()
    after = RunState.from_dict(data, where="snapshot s", clock=clock, hostnames=["n3"])
    assert (after.iteration, after.start_iter, after.samples, after.images) == (4, 4, 128, 0)
    assert after.evals == before.evals and after.earlier == [Segment(**segment)]
    assert after.split_sums() == before.split_sums() and after.split == SplitSums()
    assert clock.prior_train_s == segment["train_s"] > 0   # the run's clock goes on from the earlier segments
    assert (after.net, after.ranks, after.batch, after.read_limit_mbs, after.seed) == ("lenet_same", 2, BATCH, 4.0, 7)
    after.clock.start_training()
    after.updated(32)
    second = after.to_dict("finished")
    assert [(s["start_iter"], s["end_iter"], s["hostnames"]) for s in second["segments"]] == [(0, 4, ["n1", "n2"]),
                                                                                             (4, 5, ["n3"])]
    assert second["split_sums"]["iterations"] == 4 and second["start_sample"] == 160


def test_a_run_state_an_older_firescale_wrote_still_resumes():
    """The run state of 2026-11-23's trainer: no read limit, evaluations without their seconds, time sums
    without whole iterations (every iteration then ran in parts)."""
    old = {"net": "lenet_same", "dataset_manifest_sha256": "abc", "solver_type": "SGD", "seed": 7, "data_seed": 7,
           "start_sample": 640, "dropout_seed": 7, "ranks": 2, "batch": BATCH,
           "evals": [{"iter": 20, "epoch": 0.4, "wall_s": 3.0, "top1": 0.8, "top5": 0.99, "loss": 0.6}],
           "segments": [{"start_iter": 0, "end_iter": 20, "startup_s": 2.0, "train_s": 3.5, "eval_s": 0.5,
                         "images": 640, "status": "interrupted", "hostnames": ["h"]}],
           "split_sums": {"data_wait_s": 0.1, "compute_s": 2.0, "allreduce_s": 0.9, "iterations": 20},
           "trajectory": TRAJECTORY, "trajectory_sha256": trajectory_digest(TRAJECTORY),
           "iteration": 20, "format": "firescale.train.snapshot/2", "snapshot_format": "BINARYPROTO",
           "caffemodel": "snapshot_iter_20.caffemodel", "solverstate": "snapshot_iter_20.solverstate"}
    state = RunState.from_dict(old, where="snapshot old")
    assert state.read_limit_mbs is None and state.evals == [EvalPoint(20, 0.4, 3.0, 0.8, 0.99, 0.6, seconds=0.0)]
    assert state.earlier_split.split_iterations == 20 and state.earlier_split.whole_s == 0.0
    assert (state.iteration, state.samples, state.clock.prior_train_s) == (20, 640, 3.5)
    assert set(state.to_dict("running")) >= SNAPSHOT_KEYS


def test_a_run_state_without_a_key_it_needs_is_one_sentence_naming_it():
    data = _running().to_dict("running")
    del data["start_sample"]
    with pytest.raises(FirescaleError, match="snapshot runs/a/s_iter_4.solverstate: the run state has no "
                                             "'start_sample', so the run cannot resume from it"):
        RunState.from_dict(data, where="snapshot runs/a/s_iter_4.solverstate")
    with pytest.raises(FirescaleError, match="snapshot x: the run state is not one firescale train writes"):
        RunState.from_dict({**_running().to_dict("running"), "evals": [{"iter": 1}]}, where="snapshot x")


def test_writing_an_evaluation_down_counts_as_evaluation_time_not_training_time():
    state = _running()
    point = state.evals[-1]
    state.recorded(point, 0.05)
    assert point.seconds == pytest.approx(0.25) and state.clock.eval_s == pytest.approx(0.25)
    segment = state.to_dict("finished")["segments"][0]
    assert segment["eval_s"] == pytest.approx(sum(e["seconds"] for e in state.to_dict("finished")["evals"]))
