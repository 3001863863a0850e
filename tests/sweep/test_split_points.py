"""Sweep points whose replicas are split over devices by a layer plan: one rank per D GPUs in the job
script, the plan checked against the net when planning, and a real split run through the sweep's command."""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from scratch_site import scratch_local_site

from firescale.cluster.site import SiteProfile
from firescale.errors import FirescaleError
from firescale.jobs.render import render_job_script
from firescale.sweep.jobs import job_for_point, point_record, train_command
from firescale.sweep.plan import SweepPlan
from firescale.sweep.points import POINT_NAME, POINT_WILDCARD

REPO = Path(__file__).resolve().parents[2]
PLAN_FILE = "workflow/plans/lenet-2-devices.prototxt"
EXP = "digits-batch-schedule"


def config(site: str, points: list[dict], **sweep) -> dict:
    """The example experiment (LeNet on digits) with `points` on `site`."""
    cfg = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    cfg["experiments"].update(
        yaml.safe_load((REPO / "workflow" / "examples" / f"{EXP}.yaml").read_text())["experiments"])
    cfg["experiments"][EXP]["sweep"] = {"gpus": [1], "batch": [8]}    # the baseline only, and `points`
    cfg["experiments"][EXP]["sites"] = {site: {"points": points, **sweep}}
    return {**cfg, "site": site}


def plan(cfg: dict, site: SiteProfile | None = None) -> SweepPlan:
    return SweepPlan.build(cfg, site, experiments=[EXP], base=REPO)


def test_a_split_point_starts_one_rank_per_two_gpus_on_a_four_gpu_node():
    p = plan(config("ib-cluster", [{"gpus": 8, "batch": 64, "layer_plan": PLAN_FILE}]))
    point = p.point(EXP, "g8-b64-d2-r0")
    assert (point.ranks, point.devices, point.batch_per_gpu) == (4, 2, 16)
    assert POINT_NAME.fullmatch(point.name)["devices"] == "2" and re.fullmatch(POINT_WILDCARD, point.name)
    job = job_for_point(p, EXP, point)
    script = render_job_script(p.site, job)
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    assert "#SBATCH --gpus-per-node=4" in script and "#SBATCH --cpus-per-task=20" in script   # 40 cores / 4 GPUs x 2
    launch = shlex.split(next(l for l in script.splitlines() if l.lstrip().startswith("srun ")))
    assert "--ntasks=4" in launch and "--ntasks-per-node=2" in launch and "--cpus-per-task=20" in launch
    assert launch[launch.index("--layer-plan") + 1] == str(REPO / PLAN_FILE)
    assert point_record(p, EXP, point).nodes == 2
    # the same GPUs without a plan: one rank each, one node
    plain = render_job_script(p.site, job_for_point(p, EXP, p.point(EXP, "baseline")))
    assert "#SBATCH --ntasks-per-node=1" in plain and "#SBATCH --gpus-per-node=1" in plain


def test_a_split_point_is_predicted_per_replica_and_its_memory_per_device(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the site's relative dataset folder: no ingested digits of the user's here
    from firescale.predict.experiment import predict_experiment

    p = plan(config("ib-cluster", [{"gpus": 8, "batch": 64, "layer_plan": PLAN_FILE},
                                   {"gpus": 4, "batch": 64}]))
    out = predict_experiment(p, EXP, dataset_size=1437)["points"]
    split, plain = out["g8-b64-d2-r0"], out["g4-b64-r0"]
    assert split["gpus"] == 8 and split["iterations"] == plain["iterations"]
    assert split["iteration_s"] == pytest.approx(plain["iteration_s"])     # 4 replicas of 16 images either way
    assert split["memory"]["batch_per_gpu"] == 16 and len(split["memory"]["peak_bytes"]) == 2
    assert len(plain["memory"]["peak_bytes"]) == 1


@pytest.mark.parametrize("points, message", [
    ([{"gpus": 3, "batch": 48, "layer_plan": PLAN_FILE}],
     f"experiment {EXP}: key 'sites.ib-cluster.points[0].layer_plan' splits each replica over 2 devices, which "
     "does not divide the point's 3 GPUs"),
    ([{"gpus": 2, "batch": 16, "layer_plan": "workflow/solvers/lenet-digits.yaml"}],
     "key 'sites.ib-cluster.points[0].layer_plan' is 'workflow/solvers/lenet-digits.yaml', which has no dist plan"),
    ([{"gpus": 2, "batch": 16, "layer_plan": "workflow/plans/no-such.prototxt"}],
     "key 'sites.ib-cluster.points[0].layer_plan' is 'workflow/plans/no-such.prototxt', which cannot be read"),
    ([{"gpus": 4, "batch": 17, "layer_plan": PLAN_FILE}],
     "asks for a total batch of 17 on 2 replicas (2 GPUs each), which does not divide evenly"),
])
def test_bad_split_points_are_one_sentence_naming_the_key(points, message):
    with pytest.raises(FirescaleError) as info:
        plan(config("ib-cluster", points))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_plan_naming_a_layer_the_net_lacks_is_refused_when_planning(tmp_path):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('dist { arch { layer_assign { name: "conv1" device: 0 } '
                   'layer_assign { name: "conv9" device: 1 } } }')
    with pytest.raises(FirescaleError) as info:
        plan(config("ib-cluster", [{"gpus": 2, "batch": 16, "layer_plan": str(bad)}]))
    assert "layer_assign names layer 'conv9', which net 'lenet_same' does not have" in str(info.value)
    assert "key 'sites.ib-cluster.points[0].layer_plan'" in str(info.value)


def test_a_replica_wider_than_a_node_is_over_the_sites_limits():
    wide = config("titan", [{"gpus": 2, "batch": 16, "layer_plan": PLAN_FILE}])
    wide["experiments"][EXP]["sites"]["titan"]["walltime"] = "01:00:00"
    with pytest.raises(FirescaleError, match=r"point digits-batch-schedule/g2-b16-d2-r0 splits each replica over "
                                             r"2 GPUs: a rank of 2 devices does not fit on one node of site titan"):
        plan(wide)


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_split_point_trains_on_two_logical_devices_through_the_sweeps_command(tmp_path, run_ranks):
    site, solver = scratch_local_site(tmp_path, run_ranks, max_iter=20)
    cfg = config("local", [{"gpus": 2, "batch": 16, "layer_plan": PLAN_FILE}])
    cfg["experiments"][EXP]["solver"] = str(solver)
    p = plan(cfg, site)
    point = p.point(EXP, "g2-b16-d2-r0")
    job = job_for_point(p, EXP, point)
    assert job.ranks == 1 and job.devices_per_rank == 2
    argv = train_command(p, EXP, point)
    run_ranks(job.ranks, [sys.executable, "-m", "firescale", *argv[argv.index("train"):]])
    result = json.loads((tmp_path / "results" / "local" / EXP / point.name / "result.json").read_text())
    assert result["iterations"] == 10 and result["batch"]["ranks"] == 1 and result["batch"]["total_batch"] == 16
    devices = result["placement"]["devices"]
    assert len(set(devices)) == 2 and devices[0] != devices[-1]     # conv1 on one device, the loss on the other
