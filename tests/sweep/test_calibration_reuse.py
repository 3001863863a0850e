"""Calibrations for real on the local site, after a real baseline of LeNet on the digits: the first calibration job
is kept, a second `sweep calibrate` reuses it without a job, `--recalibrate` runs one; `calibrate: false` gives
uncalibrated predictions, marked so in the report."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from calibration_project import EXPERIMENT, SOLVER, experiments, write_experiments

from cli import run_firescale
from firescale.predict.calibration_key import calibration_key
from firescale.predict.calibration_library import calibration_file, key_file, library_dir
from firescale.sweep.jobs import calibration_dir, point_record, run_dir, train_command
from firescale.sweep.plan import load_plan
from firescale.sweep.records import write_run_record

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]   # the baseline and the calibration's short run train


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project folder whose local site has the digits ingested and the baseline trained by its sweep command
    (60 iterations at batch 64), and its calibration job rendered by `site render --calibration`."""
    folder = tmp_path_factory.mktemp("calibrated") / "project"
    folder.mkdir()
    (folder / "short.yaml").write_text(SOLVER)
    write_experiments(folder, experiments())
    proc = run_firescale("data", "ingest", "--source", "digits", "--out", ".firescale-work/datasets", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    with pytest.MonkeyPatch.context() as here:     # the local site's results are under ./.firescale-work
        here.chdir(folder)
        plan = load_plan("local", "workflow/config.yaml")
        argv = train_command(plan, EXPERIMENT, plan.baselines(EXPERIMENT)[0])
    proc = run_firescale(*argv[argv.index("train"):], cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_firescale("site", "render", "local", "--experiment", EXPERIMENT, "--calibration", "--config",
                         "workflow/config.yaml", "--out", "results/local/digits-cal/jobs/calibration.sh", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder


def _calibrate(project: Path, out: str, *more: str):
    return run_firescale("sweep", "calibrate", "local", "--experiment", EXPERIMENT, "--config", "workflow/config.yaml",
                         "--script", "results/local/digits-cal/jobs/calibration.sh", "--out", out, *more, cwd=project)


def test_a_calibration_is_kept_reused_without_a_job_and_measured_again_on_request(project, monkeypatch):
    monkeypatch.chdir(project)
    plan = load_plan("local", "workflow/config.yaml")
    key, library, job = calibration_key(plan, EXPERIMENT), library_dir(plan.site), calibration_dir(plan, EXPERIMENT)
    proc = _calibrate(project, "first.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"kept as calibration {key.digest} in {library} for lenet_same on 1 rank of site local" in proc.stdout
    measured = (job / "calibration.json").read_text()
    assert (job / "job.log").is_file() and Path("first.json").read_text() == measured
    assert calibration_file(library, key).read_text() == measured
    first = json.loads(key_file(library, key).read_text())
    assert first["fields"] == key.fields and first["experiment"] == EXPERIMENT

    shutil.rmtree(job)                       # so that anything a job writes shows
    proc = _calibrate(project, "second.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"reused calibration {key.digest} measured {first['measured_at']} for lenet_same "
                                  "on 1 rank of site local, batch 64 and 32 a rank, tensorflow fp32 (firescale ")
    assert not job.exists()                  # no job ran: no folder, log or status file
    assert Path("second.json").read_text() == measured

    proc = _calibrate(project, "third.json", "--recalibrate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (job / "job.log").is_file() and (job / "status.json").is_file()
    again = (job / "calibration.json").read_text()
    assert Path("third.json").read_text() == again == calibration_file(library, key).read_text()
    assert json.loads(again)["compute_source"]["records"] != json.loads(measured)["compute_source"]["records"]
    assert json.loads(key_file(library, key).read_text())["measured_at"] >= first["measured_at"]


def test_calibrate_false_predicts_uncalibrated_and_the_report_says_so(project, monkeypatch):
    monkeypatch.chdir(project)
    config = project / "workflow" / "uncalibrated.yaml"
    config.write_text(yaml.safe_dump(experiments(calibrate=False)))
    plan = load_plan("local", config)
    assert not plan.calibrates(EXPERIMENT)
    proc = run_firescale("predict", "experiment", "local", "--experiment", EXPERIMENT, "--config", config,
                         "--json", "predict-calibrated.json", "--markdown", "predict-calibrated.md", cwd=project)
    assert proc.returncode == 0, proc.stderr
    predicted = json.loads(Path("predict-calibrated.json").read_text())
    assert predicted["calibrated"] is False and predicted["calibration"] is None
    baseline = plan.baselines(EXPERIMENT)[0]
    train = json.loads((run_dir(plan, EXPERIMENT, baseline) / "result.json").read_text())
    runs = project / "results" / "local" / EXPERIMENT / "runs"
    write_run_record(runs / "baseline" / "result.json", point_record(plan, EXPERIMENT, baseline), "succeeded", "",
                     log_tail="", submissions=[], train=train, status=None)
    proc = run_firescale("report", "local", "--experiment", EXPERIMENT, "--results", runs, "--out", "report",
                         "--config", config, "--predictions", "predict-calibrated.json", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = Path("report/report.md").read_text()
    ppp = predicted["percent_of_peak"]
    assert "Intervals and uncalibrated predictions" in md
    assert (f"The predictions are uncalibrated: nothing measured on the site fitted the model, which took compute at "
            f"{ppp['compute']:.3g} of the device's peak and links at {ppp['comm']:.3g} of the link's (the experiment "
            "sets calibrate: false, or they were made without --calibration)") in md
    report = json.loads(Path("report/report.json").read_text())
    assert report["predictions_calibrated"] is False
    assert "Intervals and uncalibrated predictions" in Path("report/report.html").read_text()
