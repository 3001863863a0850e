"""The experiments file's keys that set how an experiment's runs train, the sweep's or a site's, passed to the
jobs and the prediction: overlap_allreduce (wait-free backprop) and read_limit_mbs (slower storage emulated)."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from firescale.errors import FirescaleError
from firescale.model.io_time import DataPath, io_time
from firescale.model.paleo import predict_point
from firescale.predict.experiment import experiment_model, predict_experiment
from firescale.sweep.jobs import train_command
from firescale.sweep.plan import SweepPlan

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
EXPERIMENT = "nin-imagenet"   # ILSVRC-2012's size is known without a manifest
NIN_INPUT_BYTES = 224 * 224 * 3   # no manifest: the net's input at one byte a pixel


def plan(site: str, sweep: dict | None = None, sites: dict | None = None) -> SweepPlan:
    config = copy.deepcopy(CONFIG)
    exp = config["experiments"][EXPERIMENT]
    exp["sweep"].update(sweep or {})
    exp["sites"].update(sites or {})
    return SweepPlan.build({**config, "site": site}, experiments=[EXPERIMENT])


def test_overlap_is_off_unless_asked_and_a_sites_key_wins_over_the_sweeps():
    point = lambda p: p.point(EXPERIMENT, "g32-b1024-r0")  # noqa: E731
    default = plan("ib-cluster")
    assert not default.overlap_allreduce(EXPERIMENT)
    assert "--overlap-allreduce" not in train_command(default, EXPERIMENT, point(default))
    on_cluster = plan("ib-cluster", sites={"ib-cluster": {"gpus": [1, 32], "batch": [1024], "overlap_allreduce": True}})
    assert on_cluster.overlap_allreduce(EXPERIMENT)
    assert "--overlap-allreduce" in train_command(on_cluster, EXPERIMENT, point(on_cluster))
    elsewhere = plan("titan", sites={"ib-cluster": {"overlap_allreduce": True}})
    assert "--overlap-allreduce" not in train_command(elsewhere, EXPERIMENT, point(elsewhere))
    everywhere_but = plan("ib-cluster", sweep={"overlap_allreduce": True},
                          sites={"ib-cluster": {"gpus": [1, 32], "batch": [1024], "overlap_allreduce": False}})
    assert not everywhere_but.overlap_allreduce(EXPERIMENT)


def test_the_prediction_of_an_overlapped_experiment_is_the_dag_models_overlapped_schedule():
    grouped, overlapped = plan("titan"), plan("titan", sweep={"overlap_allreduce": True})
    before = predict_experiment(grouped, EXPERIMENT)
    after = predict_experiment(overlapped, EXPERIMENT)
    assert (before["overlap_allreduce"], after["overlap_allreduce"]) == (False, True)
    net = experiment_model(overlapped, EXPERIMENT).net
    for name in ("g32-b1024-r0", "g128-b1024-r0"):
        p = overlapped.point(EXPERIMENT, name)
        dag = predict_point(overlapped.site, net, p.gpus, p.batch, overlap=True)
        assert after["points"][name]["iteration_s"] == pytest.approx(dag.iteration_overlap_s)
        # hiding communication behind backward can only shorten the iteration
        assert after["points"][name]["iteration_s"] < before["points"][name]["iteration_s"]
    assert after["points"]["baseline"]["iteration_s"] == pytest.approx(
        before["points"]["baseline"]["iteration_s"])   # one GPU sends nothing


def test_an_overlap_that_is_not_true_or_false_is_one_sentence():
    with pytest.raises(FirescaleError) as info:
        plan("titan", sweep={"overlap_allreduce": "yes"})
    assert "overlap_allreduce" in str(info.value) and "\n" not in str(info.value)


def limit_of(argv: list[str]) -> str | None:
    return argv[argv.index("--read-limit-mbs") + 1] if "--read-limit-mbs" in argv else None


def test_no_limit_unless_asked_and_a_sites_key_wins_over_the_sweeps():
    point = lambda p: train_command(p, EXPERIMENT, p.point(EXPERIMENT, "g32-b1024-r0"))  # noqa: E731
    default = plan("ib-cluster")
    assert default.read_limit_mbs(EXPERIMENT) is None and limit_of(point(default)) is None
    swept = plan("ib-cluster", sweep={"read_limit_mbs": 120})
    assert limit_of(point(swept)) == "120"
    # every run of the experiment reads under the limit, the baseline too: its speedups compare like with like
    assert limit_of(train_command(swept, EXPERIMENT, swept.point(EXPERIMENT, "baseline"))) == "120"
    on_site = plan("ib-cluster", sweep={"read_limit_mbs": 120},
                   sites={"ib-cluster": {"gpus": [1, 32], "batch": [1024], "read_limit_mbs": 2.5}})
    assert on_site.read_limit_mbs(EXPERIMENT) == 2.5 and limit_of(point(on_site)) == "2.5"


def test_the_prediction_counts_the_limit_as_each_ranks_read_bandwidth():
    free, limited = plan("titan"), plan("titan", sweep={"read_limit_mbs": 10})
    before, after = predict_experiment(free, EXPERIMENT), predict_experiment(limited, EXPERIMENT)
    assert after["model"]["platform"]["rank_read_bandwidth"] == 10e6
    assert before["model"]["platform"]["rank_read_bandwidth"] == 0.0
    for name, point in after["points"].items():
        per_rank = point["batch"] // point["gpus"]
        assert point["io_s"] == pytest.approx(max(before["points"][name]["io_s"], per_rank * NIN_INPUT_BYTES / 10e6))
        # reads that slow cannot hide behind the compute: the iteration is at least the read
        assert point["iteration_s"] >= point["io_s"] > before["points"][name]["iteration_s"]


@pytest.mark.parametrize("value", [0, -1, "fast"])
def test_a_limit_that_is_not_a_positive_number_is_one_sentence(value):
    with pytest.raises(FirescaleError) as info:
        plan("titan", sweep={"read_limit_mbs": value})
    assert "read_limit_mbs" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_limited_runs_data_wait_is_the_models_t_io(tmp_path, digits_dataset):
    # The model's t_io under a limit is what the trainer waits: 16 digits (64 stored bytes each) a step at
    # 0.01 MB/s is 102.4 ms of reading, far beyond the step's own compute.  The trainer reads several small
    # batches in one call (a whole read's time comes before its first batch), so the run is a whole number
    # of reads, as a long run nearly is.
    from firescale.data.batch import batches_per_read
    iterations = 2 * batches_per_read(16, (8, 8, 1))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", "firescale", "train", "--dataset", str(digits_dataset),
                           "--net", "lenet_same", "--solver", str(REPO / "workflow" / "solvers" / "lenet-digits.yaml"),
                           "--batch-per-rank", "16", "--out", str(tmp_path / "run"), "--read-limit-mbs", "0.01",
                           "--set", f"max_iter={iterations}", "--set", "test_interval=0",
                           "--set", "test_initialization=false", "--set", "snapshot=0",
                           "--set", "snapshot_after_train=false"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads((tmp_path / "run" / "result.json").read_text())["per_iteration"]
    predicted = io_time(16, 64, 1, 1, DataPath(rank_read_bandwidth=0.01e6))
    assert predicted == pytest.approx(0.1024)
    # the limit is a floor (a sleep may end late, never early); a reader thread may hide the compute's share
    assert predicted * 0.97 <= measured["data_wait_s"] + measured["compute_s"] <= predicted * 1.1, measured
