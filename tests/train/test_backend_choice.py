"""Choosing a backend and a precision: bad choices in one sentence each, bf16 training on a CPU, and the sweep's
experiment keys reaching the trainer's command line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, train_args

SOLVER = """\
type: SGD
base_lr: 0.01
momentum: 0.9
lr_policy: fixed
max_iter: 30
test_interval: 30
display: 10
snapshot: 0
snapshot_prefix: snapshot
test_initialization: false
random_seed: 3
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("choice"))
    (root / "s.yaml").write_text(SOLVER)
    return root


def _train(work: Path, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "firescale", *train_args(work, out, "s.yaml", *extra)],
                          capture_output=True, text=True, timeout=300)


def _one_sentence(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(("options", "words"), [
    (["--framework", "caffe2"], "--framework 'caffe2' is not a framework firescale trains with; use one of "
                                "tensorflow, pytorch"),
    (["--precision", "fp16"], "--precision 'fp16' is not a precision firescale trains in; use one of fp32, tf32, "
                              "bf16"),
    (["--process-group", "ucc", "--framework", "pytorch"], "--process-group 'ucc' is not one of auto, gloo, mpi, "
                                                           "nccl"),
    (["--process-group", "gloo"], "picks the pytorch backend's process group"),
])
def test_an_unknown_choice_is_one_sentence(work, options, words):
    assert words in _one_sentence(_train(work, "bad", *options))


@pytest.mark.tensorflow
def test_bf16_is_refused_by_the_tensorflow_backend(work):
    assert "precision 'bf16' is the pytorch backend's" in _one_sentence(_train(work, "bad", "--precision", "bf16"))


@pytest.mark.pytorch
def test_nccl_on_a_node_without_a_gpu_is_one_sentence(work):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this node has a GPU: NCCL is allowed here")
    words = _one_sentence(_train(work, "bad", "--framework", "pytorch", "--process-group", "nccl"))
    assert "NCCL" in words and "GPU" in words and "gloo" in words


@pytest.mark.pytorch
@pytest.mark.slow
def test_bf16_autocast_trains_on_a_cpu_and_is_recorded(work):
    """LeNet in bf16 on the CPU: the loss falls from chance, the weights stay float32, the run says bf16."""
    proc = _train(work, "bf16", "--framework", "pytorch", "--precision", "bf16", "--batch-per-rank", "32",
                  "--set", "snapshot_after_train=true")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((work / "bf16" / "result.json").read_text())
    assert result["versions"]["precision"] == "bf16" and result["versions"]["framework"] == "pytorch"
    assert result["evals"][-1]["top1"] > 0.5 and np.isfinite(result["evals"][-1]["loss"])
    from firescale.caffe.caffemodel import read_weights

    [model] = (work / "bf16" / "snapshots").glob("*.caffemodel")
    assert all(a.dtype == np.float32 for arrays in read_weights(model).values() for a in arrays)


def test_the_experiment_names_its_framework_and_precision_on_the_command_line():
    from firescale.sweep.jobs import framework_options

    assert framework_options({"framework": "tensorflow", "precision": "fp32"}) == []
    assert framework_options({"framework": "pytorch", "precision": "bf16"}) == ["--framework", "pytorch",
                                                                               "--precision", "bf16"]


def _plan_with(**keys):
    import copy

    import yaml

    from firescale.sweep.plan import SweepPlan

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "workflow" / "config.yaml").read_text())
    config = copy.deepcopy(config)
    config["experiments"]["nin-imagenet"].update(keys)
    return SweepPlan.build({**config, "site": "titan"}, experiments=["nin-imagenet"])


def test_an_experiments_framework_and_precision_reach_every_point_and_bad_ones_are_refused():
    from firescale.errors import FirescaleError
    from firescale.sweep.jobs import train_command

    plan = _plan_with(framework="pytorch", precision="bf16")
    point = plan.point("nin-imagenet", "g32-b1024-r0")
    argv = train_command(plan, "nin-imagenet", point)
    assert argv[argv.index("--framework") + 1] == "pytorch" and argv[argv.index("--precision") + 1] == "bf16"
    default = _plan_with()
    assert "--framework" not in train_command(default, "nin-imagenet", default.point("nin-imagenet", "g32-b1024-r0"))
    with pytest.raises(FirescaleError, match="framework"):
        _plan_with(framework="caffe")
    with pytest.raises(FirescaleError, match="experiment nin-imagenet: precision 'bf16' is the pytorch backend's"):
        _plan_with(precision="bf16")
