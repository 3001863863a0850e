"""A snapshot records the settings of its trajectory; a resume with other settings is refused, naming them."""
from __future__ import annotations

import subprocess
import sys

import pytest

from firescale.errors import FirescaleError
from firescale.train.checkpoint import check_same_trajectory, trajectory_digest, trajectory_settings

SOLVER = {"type": "SGD", "base_lr": 0.01, "max_iter": 100, "momentum": 0.9, "display": 10, "snapshot": 5}


def settings(**changes):
    base = dict(net="lenet_same", dataset_sha256="abc", solver=dict(SOLVER), seed=1, target_top1=None,
                batch={"ranks": 2, "total_batch": 64}, transform={"scale": 1 / 255, "mean": None})
    for key, value in changes.items():
        if key in ("solver", "batch"):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return trajectory_settings(**base)


def meta_for(s):
    return {"trajectory": s, "trajectory_sha256": trajectory_digest(s)}


def test_the_same_settings_resume():
    check_same_trajectory(meta_for(settings()), settings(), "snap.npz")


def test_printing_and_saving_settings_do_not_count():
    check_same_trajectory(meta_for(settings()), settings(solver={"display": 1, "snapshot": 50}), "snap.npz")


@pytest.mark.parametrize("change,named", [
    ({"solver": {"base_lr": 0.02}}, "solver.base_lr 0.01 there, 0.02 now"),
    ({"batch": {"ranks": 4}}, "batch.ranks 2 there, 4 now"),
    ({"solver": {"max_iter": 200}}, "solver.max_iter 100 there, 200 now"),
    ({"seed": 2}, "seed 1 there, 2 now"),
    ({"target_top1": 0.9}, "target_top1 None there, 0.9 now"),
])
def test_a_different_setting_is_refused_and_named(change, named):
    with pytest.raises(FirescaleError, match="resume only with the settings") as err:
        check_same_trajectory(meta_for(settings()), settings(**change), "runs/p/snapshots/snapshot_iter_5.npz")
    assert named in str(err.value) and "snapshot_iter_5.npz" in str(err.value)
    assert str(err.value).count(".") <= 12 and "\n" not in str(err.value)  # one sentence


def test_a_snapshot_without_settings_is_refused():
    with pytest.raises(FirescaleError, match="records no training settings"):
        check_same_trajectory({"net": "lenet_same"}, settings(), "old.npz")


@pytest.mark.tensorflow
@pytest.mark.slow
def test_train_refuses_to_continue_a_snapshot_with_another_learning_rate(tmp_path):
    def train(*extra):
        return subprocess.run([sys.executable, "-m", "firescale", "train", "--dataset", str(tmp_path / "digits"),
                               "--net", "lenet_same", "--solver", str(tmp_path / "s.yaml"), "--out",
                               str(tmp_path / "run"), "--total-batch", "32", *extra], capture_output=True, text=True,
                              timeout=300)

    subprocess.run([sys.executable, "-m", "firescale", "data", "ingest", "--source", "digits", "--out", str(tmp_path)],
                   check=True, capture_output=True)
    (tmp_path / "s.yaml").write_text("type: SGD\nbase_lr: 0.01\nmax_iter: 10\nsnapshot: 5\nrandom_seed: 3\n")
    first = train()
    assert first.returncode == 0, first.stderr[-2000:]
    again = train("--resume", "--set", "base_lr=0.05")
    assert again.returncode == 1
    assert "s_iter_10.solverstate was written with other settings (solver.base_lr 0.01 there, 0.05 now)" in again.stderr
    assert "Traceback" not in again.stderr
