"""`firescale train` reads Caffe's own lenet_solver.prototxt as Caffe does and writes its snapshots by its prefix."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.tensorflow]
CAFFE_LENET = Path(__file__).parent / "data" / "caffe" / "examples" / "mnist" / "lenet_solver.prototxt"


def test_caffes_lenet_solver_trains_and_snapshots_under_its_last_component(tmp_path, run_ranks):
    subprocess.run([sys.executable, "-m", "firescale", "data", "ingest", "--source", "digits", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    out = tmp_path / "run"
    proc = run_ranks(1, ["train", "--dataset", str(tmp_path / "digits"), "--net", "lenet_same", "--solver",
                         str(CAFFE_LENET), "--out", str(out), "--total-batch", "32", "--set", "max_iter=12",
                         "--set", "test_interval=6", "--set", "snapshot=6"], timeout=300)
    # snapshot_prefix "examples/mnist/lenet": Caffe's `lenet_iter_N`, inside the run's snapshots/
    assert sorted(p.name for p in (out / "snapshots").glob("*.solverstate")) == ["lenet_iter_12.solverstate",
                                                                                 "lenet_iter_6.solverstate"]
    assert not (out / "snapshots" / "examples").exists() and not (tmp_path / "examples").exists()
    assert "solver keys ignored" in proc.stdout and ": solver_mode" in proc.stdout
    assert "--net lenet_same is trained; the solver's net: 'examples/mnist/lenet_train_test.prototxt' is set aside" \
        in proc.stdout
    result = json.loads((out / "result.json").read_text())
    assert result["solver"]["ignored"] == {"net": "examples/mnist/lenet_train_test.prototxt", "solver_mode": "GPU"}
    assert [e["iter"] for e in result["evals"]] == [0, 6, 12]     # Caffe tests at initialisation by default
