"""Batch schedules (Oh and Lee's 16+ and 32+): the batch changes at an iteration, the learning rate follows
the scaling rule, the data stream goes on where it was, and a resumed run repeats the uninterrupted one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, train_args, weights

from firescale.errors import FirescaleError
from firescale.train.scaling import parse_batch_schedule, plan_schedule

SOLVER = """\
type: SGD
base_lr: 0.02
momentum: 0.9
lr_policy: fixed
max_iter: 40
test_interval: 10
test_initialization: false
display: 10
snapshot: 10
random_seed: 5
"""


def test_phases_scale_the_rate_and_count_samples():
    schedule = plan_schedule(2, parse_batch_schedule("10:16,25:32"), total_batch=8, lr_scaling="linear")
    assert [p.total_batch for _, p in schedule.phases] == [8, 16, 32]
    assert [p.lr_scale for _, p in schedule.phases] == [1.0, 2.0, 4.0]  # against the starting batch
    assert schedule.plan_at(9).total_batch == 8 and schedule.plan_at(10).total_batch == 16
    assert schedule.samples_before(10) == 80 and schedule.samples_before(30) == 80 + 15 * 16 + 5 * 32
    assert schedule.starts_at(25) and not schedule.starts_at(0)
    per_rank = plan_schedule(2, [(5, 8)], batch_per_rank=4, lr_scaling="sqrt")
    # Against the per-rank reference (4): 2 x 4 images scale by sqrt(2), then 2 x 8 by sqrt(4).
    assert per_rank.plan_at(0).lr_scale == pytest.approx(2 ** 0.5)
    assert per_rank.plan_at(5).batch_per_rank == 8 and per_rank.plan_at(5).lr_scale == pytest.approx(2.0)
    for bad in ("16", "10:16,5:32", "0:16", "a:b"):
        with pytest.raises(FirescaleError, match="--batch-schedule"):
            parse_batch_schedule(bad)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("schedule"))
    (root / "s.yaml").write_text(SOLVER)
    return root


def _args(work: Path, out: str, *extra: str) -> list[str]:
    return train_args(work, out, "s.yaml", "--total-batch", "16", "--batch-schedule", "20:32", "--lr-scaling",
                      "linear", *extra)


@pytest.mark.tensorflow
@pytest.mark.slow
@pytest.mark.mpi
def test_a_schedule_switches_batch_and_rate_and_resumes_exactly(work, run_ranks):
    proc = run_ranks(1, _args(work, "full"), timeout=300)
    assert "iter 20: the batch becomes 32 per rank (32 per update), learning rate x 2" in proc.stdout
    result = json.loads((work / "full" / "result.json").read_text())
    assert [(p["iteration"], p["total_batch"], p["lr_scale"]) for p in result["batch"]["schedule"]] == \
        [(0, 16, 1.0), (20, 32, 2.0)]
    train = 1437  # digits' training split (80% of 1,797)
    assert result["epochs"] == pytest.approx((20 * 16 + 20 * 32) / train, rel=1e-3)
    assert [e["iter"] for e in result["evals"]] == [10, 20, 30, 40]
    assert result["evals"][2]["epoch"] == pytest.approx((20 * 16 + 10 * 32) / train, rel=1e-3)

    # resume from the snapshot at 30 (inside the batch-32 phase) with the same settings, to 40
    (work / "part" / "snapshots").mkdir(parents=True)
    for snap in (work / "full" / "snapshots").glob("s_iter_30*"):
        shutil.copy(snap, work / "part" / "snapshots" / snap.name)
    run_ranks(1, _args(work, "part", "--resume"), timeout=300)
    segments = json.loads((work / "part" / "result.json").read_text())["segments"]
    assert [(s["start_iter"], s["end_iter"]) for s in segments] == [(0, 30), (30, 40)]
    a, b = (weights(work / run / "snapshots" / "s_iter_40.solverstate") for run in ("full", "part"))
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name
