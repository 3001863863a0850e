"""The experiments file's overlap_allreduce key: the sweep's or a site's, passed to the jobs and the prediction."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from firescale.errors import FirescaleError
from firescale.model.paleo import predict_point
from firescale.predict.experiment import experiment_model, predict_experiment
from firescale.sweep.jobs import train_command
from firescale.sweep.plan import SweepPlan

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
EXPERIMENT = "nin-imagenet"   # ILSVRC-2012's size is known without a manifest


def plan(site: str, sweep: dict | None = None, sites: dict | None = None) -> SweepPlan:
    config = copy.deepcopy(CONFIG)
    exp = config["experiments"][EXPERIMENT]
    exp["sweep"].update(sweep or {})
    exp["sites"].update(sites or {})
    return SweepPlan.build({**config, "site": site}, experiments=[EXPERIMENT])


def test_off_unless_asked_and_a_sites_key_wins_over_the_sweeps():
    point = lambda p: p.point(EXPERIMENT, "g32-b1024-r0")  # noqa: E731
    default = plan("ib-cluster")
    assert not default.overlap_allreduce(EXPERIMENT)
    assert "--overlap-allreduce" not in train_command(default, EXPERIMENT, point(default))
    on_cluster = plan("ib-cluster", sites={"ib-cluster": {"gpus": [1, 32], "overlap_allreduce": True}})
    assert on_cluster.overlap_allreduce(EXPERIMENT)
    assert "--overlap-allreduce" in train_command(on_cluster, EXPERIMENT, point(on_cluster))
    elsewhere = plan("titan", sites={"ib-cluster": {"overlap_allreduce": True}})
    assert "--overlap-allreduce" not in train_command(elsewhere, EXPERIMENT, point(elsewhere))
    everywhere_but = plan("ib-cluster", sweep={"overlap_allreduce": True},
                          sites={"ib-cluster": {"gpus": [1, 32], "overlap_allreduce": False}})
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


def test_a_key_that_is_not_true_or_false_is_one_sentence():
    with pytest.raises(FirescaleError) as info:
        plan("titan", sweep={"overlap_allreduce": "yes"})
    assert "overlap_allreduce" in str(info.value) and "\n" not in str(info.value)
