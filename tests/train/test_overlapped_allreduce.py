"""`firescale train --overlap-allreduce` on two real MPI ranks: each gradient's allreduce starts as backward
produces it, and the weights and accuracy are the grouped allreduce's, bit for bit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, train_args, weights

SOLVER = """\
type: SGD
base_lr: 0.05
momentum: 0.9
weight_decay: 0.0005
lr_policy: fixed
max_iter: 20
test_interval: 20
display: 0
snapshot: 0
snapshot_prefix: snapshot
test_initialization: false
random_seed: 3
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("overlap"))
    (root / "solver.yaml").write_text(SOLVER)
    return root


def _requests(timeline: Path) -> dict[str, int]:
    """How many times each tensor was negotiated for an allreduce in Horovod's timeline (written by rank 0)."""
    text = timeline.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    counts: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "B" and e.get("name") == "NEGOTIATE_ALLREDUCE":
            counts[names[e["pid"]]] = counts.get(names[e["pid"]], 0) + 1
    return counts


@pytest.mark.tensorflow
@pytest.mark.mpi
@pytest.mark.slow
def test_overlapped_allreduce_gives_the_grouped_weights_and_accuracy_on_two_ranks(work, run_ranks):
    runs = {}
    for mode, extra in (("grouped", ()), ("overlapped", ("--overlap-allreduce",))):
        timeline = work / f"{mode}-timeline.json"
        run_ranks(2, train_args(work, mode, "solver.yaml", "--batch-per-rank", "16", *extra),
                  env={"HOROVOD_TIMELINE": str(timeline)}, timeout=300)
        runs[mode] = (json.loads((work / mode / "result.json").read_text()),
                      weights(work / mode / "snapshots" / "snapshot_iter_20.solverstate"), _requests(timeline))
    (grouped, g_weights, g_requests), (overlapped, o_weights, o_requests) = runs["grouped"], runs["overlapped"]
    assert (grouped["allreduce"]["overlap"], overlapped["allreduce"]["overlap"]) == (False, True)
    # two ranks: each element is a + b whatever fuses with it, so the same bits after 20 updates
    assert g_weights.keys() == o_weights.keys()
    for name in g_weights:
        assert np.array_equal(g_weights[name], o_weights[name]), name
    assert [e["top1"] for e in grouped["evals"]] == [e["top1"] for e in overlapped["evals"]]
    assert overlapped["evals"][-1]["top1"] > 0.5   # it learnt: 20 updates of LeNet on digits
    # The grouped iterations hand LeNet's 8 gradients and the loss pair to Horovod as one group; the overlapped
    # ones each on its own, none grouped, every whole iteration (19: iteration 0 runs in parts) and the warm-up.
    per_tensor = {name: n for name, n in o_requests.items() if name.startswith("HorovodAllreduce_")}
    assert len(per_tensor) == 9 and set(per_tensor.values()) == {20}, o_requests
    assert not any(name.startswith("HorovodAllreduce_") for name in g_requests), g_requests
    grouped_parts = [name for name in g_requests if name.startswith("HorovodGroupedAllreduce_gradient_tape")]
    assert len(grouped_parts) == 9 and {g_requests[n] for n in grouped_parts} == {20}, g_requests


def test_accumulated_micro_batches_are_refused_in_one_sentence(work):
    args = train_args(work, "acc", "solver.yaml", "--overlap-allreduce", "--set", "iter_size=2")
    proc = subprocess.run([sys.executable, "-m", "firescale", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "--overlap-allreduce needs the solver's iter_size to be 1, not 2" in last, proc.stderr[-2000:]
    assert not (work / "acc").exists()
