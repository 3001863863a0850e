"""`firescale bench trainer`: the trainer and its framework's bare loop run side by side on real ranks.

Timings on shared cores are the benchmark's to print; the test checks what must hold whatever the
load: both sides ran on the asked ranks, the ratio is of the numbers recorded, and the two sides did
the same arithmetic (the same loss after the same iterations on the same batches)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from firescale.bench.trainer import TrainerBenchRuns, TrainerVsBare, compare_trainer


def test_the_ratio_is_the_trainers_images_per_s_over_the_bare_loops():
    row = TrainerVsBare(2, 64, trainer=[90.0, 80.0, 100.0], bare=[100.0, 120.0, 110.0])
    assert row.percent == pytest.approx(100 * 90 / 110)
    assert row.best_percent == pytest.approx(100 * 100 / 120)
    assert row.to_dict()["percent"] == row.percent


@pytest.mark.tensorflow
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


class _RecordedRanks:
    """Stands in for a site's ranks: records each command and writes what the side it starts would write."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def run(self, ranks: int, command: list[str], what: str, *, timeout: float) -> str:
        self.commands.append(command)
        out = Path(command[command.index("--out" if "--out" in command else "--json") + 1])
        if "train" in command:
            out.mkdir(parents=True)
            out.joinpath("result.json").write_text(json.dumps({"ranks": ranks, "iterations": 12, "images_per_s": 90.0}))
            return "iter 12/12 loss 1.5025 lr 0.05\n"
        out.write_text(json.dumps({"ranks": ranks, "images_per_s": 100.0, "final_loss": 1.50248}))
        return ""


@pytest.mark.parametrize("framework, module", [("tensorflow", "firescale.bench.bare_loop"),
                                               ("pytorch", "firescale.bench.bare_loop_torch")])
def test_each_framework_sets_its_trainer_beside_its_own_bare_loop(tmp_path, framework, module):
    ranks = _RecordedRanks()
    runs = TrainerBenchRuns(tmp_path / "data", "lenet_same", tmp_path / "s.yaml", 16, 12, tmp_path, ranks,
                            framework=framework)
    (row,) = compare_trainer(runs, [2], 1)
    trainer, bare = ranks.commands
    assert trainer[trainer.index("--framework") + 1] == framework
    assert bare[bare.index("-m") + 1] == module
    assert row.framework == framework and row.to_dict()["framework"] == framework
    assert row.percent == pytest.approx(90.0) and (row.trainer_loss, row.bare_loss) == (1.5025, 1.50248)
    # pytorch's sides take one process group, auto unless named; TensorFlow's have none to take
    assert all(("--process-group" in c) == (framework == "pytorch") for c in (trainer, bare))
    if framework == "pytorch":
        ranks = _RecordedRanks()
        (tmp_path / "gloo").mkdir()
        compare_trainer(replace(runs, ranks=ranks, process_group="gloo", workdir=tmp_path / "gloo"), [2], 1)
        assert all(c[c.index("--process-group") + 1] == "gloo" for c in ranks.commands)


@pytest.mark.slow
@pytest.mark.pytorch
@pytest.mark.mpi
def test_bench_trainer_pytorch_runs_both_sides_on_two_ranks_with_the_same_arithmetic(tmp_path, repo, digits_dataset):
    """The torch trainer against the bare torch loop (on the MPI group auto takes under mpirun): the same first
    batches in firescale's sharded order, the same net, seed and Caffe update on both sides give the same loss
    after 12 iterations."""
    out = tmp_path / "bt.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "bench", "trainer", "--framework", "pytorch",
                           "--dataset", str(digits_dataset), "--ranks", "2", "--iterations", "12", "--repeats", "1",
                           "--batch-per-rank", "16", "--workdir", str(tmp_path / "runs"), "--json", str(out)],
                          capture_output=True, text=True, timeout=400, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["framework"] == "pytorch"
    (row,) = data["rows"]
    assert row["framework"] == "pytorch" and row["ranks"] == 2 and row["batch_per_rank"] == 16
    assert len(row["trainer"]) == len(row["bare"]) == 1 and min(row["trainer"] + row["bare"]) > 0
    # The trainer prints its loss to 4 decimals (off by at most 5e-5); the arithmetic itself is the same.
    assert row["trainer_loss"] == pytest.approx(row["bare_loss"], abs=1e-4)
    bare = json.loads((tmp_path / "runs" / "bare-r2-0.json").read_text())
    assert bare["framework"] == "pytorch" and bare["process_group"] == "mpi" and bare["ranks"] == 2
    result = json.loads((tmp_path / "runs" / "trainer-r2-0" / "result.json").read_text())
    assert result["ranks"] == 2 and result["iterations"] == 12 and result["versions"]["framework"] == "pytorch"
    assert "pytorch" in proc.stdout and "trainer % of bare" in proc.stdout
