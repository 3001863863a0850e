"""A calibration's key (what it measured) and the site's library of kept ones: the same measurement gives the same
key wherever the checkout lies, anything it measured changes it, and `sweep calibrate` reuses a match without a job."""
from __future__ import annotations

import copy
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from calibration_project import EXPERIMENT, SOLVER, VERSIONS, baseline_result, experiments, write_experiments

from cli import run_firescale
from firescale.cluster.site import SiteProfile, load_site
from firescale.errors import FirescaleError
from firescale.predict.calibration_key import CalibrationKey, calibration_key, net_identity
from firescale.predict.calibration_library import calibration_file, find_kept, keep, key_file, library_dir
from firescale.predict.calibration_run import CalibrationRequest, run_calibration
from firescale.predict.experiment import experiment_platform
from firescale.sweep.config import validate_config
from firescale.sweep.jobs import calibration_dir, run_dir
from firescale.sweep.plan import SweepPlan, load_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder (its experiments file and solver) with the baseline's result, worked in as the workflow
    works: the local site's results under ./.firescale-work."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "short.yaml").write_text(SOLVER)
    config = write_experiments(folder, experiments())
    monkeypatch.chdir(folder)
    baseline_result(load_plan("local", config), VERSIONS)
    return folder


def key_of(project: Path, site: str | SiteProfile = "local") -> CalibrationKey:
    return calibration_key(load_plan(site, project / "workflow" / "config.yaml"), EXPERIMENT)


def test_the_same_measurement_has_the_same_key_wherever_the_checkout_lies(project, tmp_path, monkeypatch):
    key = key_of(project)
    assert key == key_of(project) and len(key.digest) == 16 and int(key.digest, 16) >= 0
    assert key.fields["versions"] == {"firescale": "0.1.0", "tensorflow": "2.15.1", "horovod": "0.28.1",
                                      "mpi": "mpirun (Open MPI) 4.1.4"}     # no host, commit or Python
    assert key.fields["probe"] == {"ranks": 1, "nodes": 1, "ranks_per_node": 1}
    assert key.fields["batch_per_rank"] == [64, 32]                           # the baseline's and the short run's
    assert str(tmp_path) not in json.dumps(key.fields)
    assert key.describe() == ("lenet_same on 1 rank of site local, batch 64 and 32 a rank, tensorflow fp32 "
                              "(firescale 0.1.0, tensorflow 2.15.1, horovod 0.28.1, mpi mpirun (Open MPI) 4.1.4)")
    moved = tmp_path / "elsewhere" / "project"
    shutil.copytree(project, moved)
    monkeypatch.chdir(moved)
    assert key_of(moved).digest == key.digest


@pytest.mark.parametrize("changes, field", [
    ({"batch": {"mode": "total", "baseline": 32}}, "batch_per_rank"),
    ({"sweep": {"gpus": [1], "batch": [16]}}, "batch_per_rank"),               # the short run's batch
    ({"sweep": {"gpus": [1, 2], "batch": [64]}}, "probe"),                     # the probe's ranks
    ({"framework": "pytorch"}, "framework"),
    ({"precision": "tf32"}, "precision"),
    ({"net": "lenet"}, "net"),
    ({"dataset": {"name": "digits", "source": "digits", "transform": {"crop": 6}}}, "crop"),
    ({"walltime": "00:20:00"}, None),            # how long its job may run, not what it measures
    ({"description": "another", "max_resubmits": 1, "target": {"tolerance": 0.05}}, None),
])
def test_what_a_calibration_measures_changes_its_key_and_nothing_else_does(project, changes, field):
    before = key_of(project)
    write_experiments(project, experiments(**changes))
    after = key_of(project)
    assert (after.digest == before.digest) == (field is None)
    if field is not None:
        assert after.fields[field] != before.fields[field]
        assert {k for k in after.fields if after.fields[k] != before.fields[k]} >= {field}


def test_the_versions_the_baseline_ran_and_the_sites_hardware_change_the_key(project):
    before = key_of(project)
    plan = load_plan("local", project / "workflow" / "config.yaml")
    for name, changed in (("tensorflow", True), ("horovod", True), ("firescale", True), ("mpi", True),
                          ("hostname", False), ("commit", False), ("python", False)):
        baseline_result(plan, {**VERSIONS, name: "9.9.9"})
        assert (key_of(project).digest != before.digest) == changed, name
    baseline_result(plan, VERSIONS)
    local = load_site("local")

    def site_with(edit) -> SiteProfile:
        config = copy.deepcopy(local.config)
        edit(config)
        return SiteProfile(name=local.name, source=local.source, config=config)

    faster = site_with(lambda c: c["device"].update(peak_tflops=0.6))
    assert key_of(project, faster).digest != before.digest
    moved = site_with(lambda c: c.update(paths={**c["paths"], "scratch": "/elsewhere"}, poll_seconds=5))
    assert key_of(project, moved).digest == before.digest


def test_a_net_file_is_keyed_by_its_content_not_its_path(tmp_path):
    shipped = REPO / "src" / "firescale" / "nets" / "caffe_zoo" / "mnist" / "lenet_train_test.prototxt"
    here, there = tmp_path / "a" / "net.prototxt", tmp_path / "b" / "lenet.prototxt"
    for path in (here, there):
        path.parent.mkdir()
        shutil.copy(shipped, path)
    assert net_identity(str(here)) == net_identity(str(there)) and net_identity(str(here)).startswith("sha256:")
    there.write_text(there.read_text().replace("num_output: 500", "num_output: 400"))
    assert net_identity(str(here)) != net_identity(str(there))
    assert net_identity("lenet_same") == "lenet_same"


def test_a_key_needs_the_baselines_result(project):
    plan = load_plan("local", project / "workflow" / "config.yaml")
    (run_dir(plan, EXPERIMENT, plan.baselines(EXPERIMENT)[0]) / "result.json").unlink()
    with pytest.raises(FirescaleError, match=r"result.json: no result of the baseline of digits-cal, whose versions "
                                             r"key its calibration; run the baseline first"):
        key_of(project)


def numbers_calibration(plan: SweepPlan, out: Path) -> Path:
    """A calibration as `firescale predict calibrate --batch 64 --iteration-s 0.012` fits and writes it."""
    request = CalibrationRequest(batch=64, iteration_s=0.012, net="lenet_same", input_shape=(8, 8, 1), classes=10,
                                 out=str(out))
    run_calibration(request, experiment_platform(plan.site, None), plan.site, say=lambda line: None)
    return out


def test_a_kept_calibration_is_found_by_its_key_alone(project, tmp_path):
    plan = load_plan("local", project / "workflow" / "config.yaml")
    key, folder = calibration_key(plan, EXPERIMENT), tmp_path / "calibrations"
    made = numbers_calibration(plan, tmp_path / "made.json")
    assert find_kept(folder, key) is None
    kept = keep(folder, key, made, EXPERIMENT)
    assert calibration_file(folder, key).read_text() == made.read_text()
    beside = json.loads(key_file(folder, key).read_text())        # why it matched, for a person
    assert beside["fields"] == key.fields and beside["key"] == key.digest and beside["experiment"] == EXPERIMENT
    assert find_kept(folder, key) == kept
    other = CalibrationKey({**key.fields, "framework": "pytorch"})
    assert find_kept(folder, other) is None
    # a digest kept for other fields is no match
    key_file(folder, key).write_text(json.dumps({**beside, "fields": other.fields}))
    assert find_kept(folder, key) is None
    key_file(folder, key).write_text(json.dumps(beside))
    calibration_file(folder, key).write_text('{"site": "local"}')
    with pytest.raises(FirescaleError, match=f"{calibration_file(folder, key)}: a calibration needs site, "
                                             "ppp_compute and ppp_comm"):
        find_kept(folder, key)


def test_sweep_calibrate_reuses_a_kept_calibration_without_running_a_job(project, tmp_path):
    plan = load_plan("local", project / "workflow" / "config.yaml")
    key = calibration_key(plan, EXPERIMENT)
    kept = keep(library_dir(plan.site), key, numbers_calibration(plan, tmp_path / "made.json"), EXPERIMENT)
    script = project / "calibration.sh"
    script.write_text("#!/bin/bash\nexit 3\n")           # never run: a match is reused
    out = project / "results" / "local" / EXPERIMENT / "calibration.json"
    proc = run_firescale("sweep", "calibrate", "local", "--experiment", EXPERIMENT, "--config",
                         "workflow/config.yaml", "--script", script, "--out", out, cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"reused calibration {key.digest} measured {kept.measured_at} for {key.describe()} (by "
                           f"experiment {EXPERIMENT}; --recalibrate measures afresh) -> {out}\n")
    assert out.read_text() == calibration_file(library_dir(plan.site), key).read_text()
    assert not calibration_dir(plan, EXPERIMENT).exists()          # no job folder, log or status file
    # another batch is another measurement: no match, so its job runs; the real one, which fails at once here
    # (this baseline's result has no command to run again at the short batch)
    write_experiments(project, experiments(batch={"mode": "total", "baseline": 32}))
    rendered = project / "results" / "local" / EXPERIMENT / "jobs" / "calibration.sh"
    proc = run_firescale("site", "render", "local", "--experiment", EXPERIMENT, "--calibration", "--config",
                         "workflow/config.yaml", "--out", rendered, cwd=project)
    assert proc.returncode == 0, proc.stderr
    proc = run_firescale("sweep", "calibrate", "local", "--experiment", EXPERIMENT, "--config",
                         "workflow/config.yaml", "--script", rendered, "--out", tmp_path / "other.json", cwd=project)
    assert proc.returncode == 1 and "the calibration job of digits-cal on site local failed" in proc.stderr
    assert "keeps neither its options nor a `firescale train` command line to repeat" in proc.stderr
    assert (calibration_dir(plan, EXPERIMENT) / "job.log").is_file() and not (tmp_path / "other.json").exists()


def test_the_schema_has_calibrate_for_an_experiment_and_recalibrate_for_a_run(project):
    config = validate_config(experiments())
    assert config["experiments"][EXPERIMENT]["calibrate"] is True        # the default: calibrated predictions
    assert validate_config(experiments(calibrate=False))["experiments"][EXPERIMENT]["calibrate"] is False
    with pytest.raises(FirescaleError, match=r"^workflow/config.yaml: key 'experiments.digits-cal.calibrate': 'no' "
                                             r"is not allowed; expected true or false$"):
        validate_config(experiments(calibrate="no"))
    with pytest.raises(FirescaleError, match=r"key 'recalibrate': 'true' is not allowed; expected true or false$"):
        validate_config({**experiments(), "recalibrate": "true"})
    plan = SweepPlan.build({**experiments(), "recalibrate": True}, load_site("local"), base=project)
    assert "recalibrate" not in plan.anchored_config()       # not in experiments.yaml: toggling it re-plans nothing
    assert replace(plan, config=validate_config(experiments(calibrate=False))).calibrates(EXPERIMENT) is False


def test_a_pytorch_calibration_is_keyed_by_the_process_group_its_runs_take(project):
    """auto resolved as the runs' ranks resolve it: MPI's group under the local site's mpirun, Gloo's where the
    launcher starts no MPI; a TensorFlow calibration has none."""
    assert key_of(project).fields["process_group"] is None
    write_experiments(project, experiments(framework="pytorch"))
    mpi = key_of(project)
    assert mpi.fields["process_group"] == "mpi"
    local = load_site("local")
    config = copy.deepcopy(local.config)
    config.update(launcher="srun", srun_mpi="none")
    gloo = key_of(project, SiteProfile(name=local.name, source=local.source, config=config))
    assert gloo.fields["process_group"] == "gloo" and gloo.digest != mpi.digest
