"""`firescale bench trainer`: the trainer and the bare Horovod loop run side by side on real ranks.

Timings on shared cores are the benchmark's to print; the test checks what must hold whatever the
load: both sides ran on the asked ranks, the ratio is of the numbers recorded, and the two sides did
the same arithmetic (the same loss after the same iterations on the same batches)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from firescale.bench.trainer import TrainerVsBare


def test_the_ratio_is_the_trainers_images_per_s_over_the_bare_loops():
    row = TrainerVsBare(2, 64, trainer=[90.0, 80.0, 100.0], bare=[100.0, 120.0, 110.0])
    assert row.percent == pytest.approx(100 * 90 / 110)
    assert row.best_percent == pytest.approx(100 * 100 / 120)
    assert row.to_dict()["percent"] == row.percent


@pytest.mark.slow
def test_bench_trainer_runs_both_sides_on_two_ranks_with_the_same_arithmetic(tmp_path, repo, digits_dataset):
    out = tmp_path / "bt.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", "firescale", "bench", "trainer", "--dataset", str(digits_dataset),
                           "--ranks", "2", "--iterations", "12", "--repeats", "1", "--batch-per-rank", "16",
                           "--workdir", str(tmp_path / "runs"), "--json", str(out)],
                          capture_output=True, text=True, timeout=400, cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["ranks"] == 2 and row["batch_per_rank"] == 16
    assert len(row["trainer"]) == len(row["bare"]) == 1 and min(row["trainer"] + row["bare"]) > 0
    assert row["percent"] == pytest.approx(100 * row["trainer"][0] / row["bare"][0])
    # 12 iterations of the same first batches, the same net, seed and Caffe update: the same loss
    # (the trainer prints it to 4 decimals).
    assert row["trainer_loss"] == pytest.approx(row["bare_loss"], abs=1.5e-4)
    assert len(data["load_average"]) == 2
    assert "trainer % of bare" in proc.stdout
    result = json.loads((tmp_path / "runs" / "trainer-r2-0" / "result.json").read_text())
    assert result["ranks"] == 2 and result["iterations"] == 12
