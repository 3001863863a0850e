"""Sweep points with a batch schedule (Oh and Lee's 16+ and 32+): planning, names, budgets, job commands,
prediction, and one real run through the sweep's own command, reported with its batch phases."""
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
from firescale.sweep.points import POINT_NAME, POINT_WILDCARD, batch_label, schedule_from_name
from firescale.sweep.records import name_mismatch, read_run_record, write_run_record

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "digits-batch-schedule"


def example_config() -> dict:
    """workflow/config.yaml with the example experiment merged in, as `--configfile` merges it."""
    config = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    config["experiments"].update(
        yaml.safe_load((REPO / "workflow" / "examples" / f"{EXAMPLE}.yaml").read_text())["experiments"])
    return {**config, "site": "local"}


def plan(config: dict | None = None, site: SiteProfile | None = None) -> SweepPlan:
    return SweepPlan.build(config or example_config(), site, experiments=[EXAMPLE], base=REPO)


def sets(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")


def test_the_example_plans_16_plus_and_32_plus_beside_their_fixed_batches():
    p = plan()
    assert p.point_names(EXAMPLE) == ["baseline", "g1-b16-r0", "g1-b32-r0", "g1-b8+16at200-r0", "g1-b8+32at200-r0"]
    plus16 = p.point(EXAMPLE, "g1-b8+16at200-r0")
    assert (plus16.batch, plus16.schedule, plus16.lr, plus16.peak_batch_per_gpu) == (8, ((200, 16),), 0.01, 16)
    # the same images as the baseline (600 x 8): 200 x 8, then 3,200 / 16 = 200 more; 3,200 / 32 = 100
    assert p.budget(EXAMPLE, plus16).max_iter == 400
    assert p.budget(EXAMPLE, p.point(EXAMPLE, "g1-b8+32at200-r0")).max_iter == 300
    assert p.budget(EXAMPLE, p.point(EXAMPLE, "g1-b16-r0")).max_iter == 300


def test_a_scheduled_points_command_scales_each_phases_rate_by_the_experiments_rule():
    p = plan()
    argv = train_command(p, EXAMPLE, p.point(EXAMPLE, "g1-b8+32at200-r0"))
    option = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert (option("--total-batch"), option("--batch-schedule"), option("--lr-scaling"), option("--reference-batch")) \
        == ("8", "200:32", "linear", "8")
    assert sets(argv)["base_lr"] == "0.01" and sets(argv)["max_iter"] == "300"
    plain = train_command(p, EXAMPLE, p.point(EXAMPLE, "g1-b32-r0"))
    assert "--batch-schedule" not in plain and plain[plain.index("--lr-scaling") + 1] == "none"
    assert sets(plain)["base_lr"] == "0.04"


def test_the_job_script_carries_the_schedule_as_shell_words():
    p = plan()
    job = job_for_point(p, EXAMPLE, p.point(EXAMPLE, "g1-b8+16at200-r0"))
    assert job.name == "fs-digits-batch-sc-b89e-g1-b8_16at200-r0"   # letters, digits and _.-, 40 at most
    script = render_job_script(p.site, job)
    line = next(l for l in script.splitlines() if "--batch-schedule" in l)
    words = shlex.split(line)
    assert words[words.index("--batch-schedule") + 1] == "200:16"
    assert any(w.endswith("/digits-batch-schedule/g1-b8+16at200-r0") for w in words)


def test_point_names_round_trip_through_the_records_and_the_wildcard():
    p = plan()
    for point in p.points[EXAMPLE]:
        assert POINT_NAME.fullmatch(point.name) and re.fullmatch(POINT_WILDCARD, point.name)
        assert schedule_from_name(point.name) == point.schedule
        assert name_mismatch(point.name, point.gpus, point.batch, point.lr, point.repeat, point.baseline) == ""
    assert batch_label("g1-b8+16at200+32at300-lr0.01-r2", 8) == "8+16+32" and batch_label("g2-b64-r0", 64) == "64"
    assert schedule_from_name("g1-b8+16at200+32at300-lr0.01-r2") == ((200, 16), (300, 32))
    assert not re.fullmatch(POINT_WILDCARD, "g1-b8+16-r0") and not POINT_NAME.fullmatch("g1-b8+at200-r0")


def _with(schedules=None, points=None, gpus=(1,)) -> dict:
    config = example_config()
    sweep = config["experiments"][EXAMPLE]["sweep"]
    sweep["gpus"] = list(gpus)
    if schedules is not None:
        sweep["batch_schedules"] = schedules
    if points is not None:
        sweep["points"] = points
    return config


def phases(*pairs):
    return [{"iteration": i, "batch": b} for i, b in pairs]


KEY = f"experiment {EXAMPLE}: key 'sweep.batch_schedules"


@pytest.mark.parametrize("config, message", [
    (_with([phases((0, 8))]), f"{KEY}[0]' lists 1 phase(s); a batch schedule needs its first phase"),
    (_with([phases((5, 8), (200, 16))]),
     f"{KEY}[0][0].iteration' is 5; a batch schedule's first phase starts at iteration 0"),
    (_with([phases((0, 8), (200, 16)), phases((0, 8), (300, 16), (300, 32))]),
     f"{KEY}[1][2].iteration' is 300, not after the phase before (300)"),
    (_with([phases((0, 8), (200, 8))]), f"{KEY}[0][1].batch' is 8, the batch of the phase before"),
    (_with([phases((0, 8), (200, 18))], gpus=[4]),
     f"{KEY}[0]' asks for a total batch of 18 on 4 GPUs, which does not divide evenly"),
    (_with(points=[{"gpus": 1, "batch": 8, "batch_schedule": phases((0, 8), (20, 16))}]),
     f"experiment {EXAMPLE}: key 'sweep.points[0]' needs one of 'batch' and 'batch_schedule'"),
    (_with([phases((0, 8), (700, 16))]),
     f"experiment {EXAMPLE}: point g1-b8+16at700-r0: its batch schedule changes the batch to 16 at iteration 700, "
     "but its budget of 4800 images ends at iteration 600"),
    (_with([[{"iteration": 0, "batch": 8}, {"iteration": 20, "batch": 16, "lr": 0.1}]]),
     f"unknown key 'lr' under 'experiments.{EXAMPLE}.sweep.batch_schedules.0.1'; allowed keys: batch, iteration"),
])
def test_bad_schedules_are_one_sentence_naming_the_key(config, message):
    with pytest.raises(FirescaleError) as info:
        plan(config)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_explicit_scheduled_point_in_per_gpu_batches_and_its_prediction_by_phase(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the site's relative dataset folder: no ingested digits of the user's here
    config = _with(schedules=[], points=[{"gpus": 2, "batch_schedule": phases((0, 4), (100, 8)), "lr": 0.03}])
    del config["experiments"][EXAMPLE]["sweep"]["batch_schedules"]
    config["experiments"][EXAMPLE]["batch"]["mode"] = "per_gpu"
    p = plan(config)
    point = p.point(EXAMPLE, "g2-b8+16at100-r0")
    assert (point.batch, point.schedule, point.lr) == (8, ((100, 16),), 0.03)
    argv = train_command(p, EXAMPLE, point)
    assert argv[argv.index("--batch-schedule") + 1] == "100:16" and sets(argv)["base_lr"] == "0.03"
    from firescale.predict.experiment import predict_experiment

    out = predict_experiment(p, EXAMPLE, dataset_size=1437)["points"]
    # 100 iterations at 8, then the rest of the baseline's 4,800 images at 16: 250 iterations in all
    assert out[point.name]["iterations"] == 100 + 250 == p.budget(EXAMPLE, point).max_iter
    assert out[point.name]["epochs"] == pytest.approx(out["baseline"]["epochs"])
    assert out[point.name]["memory"]["batch_per_gpu"] == 8      # the larger phase's batch per GPU


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_scheduled_point_trains_through_the_sweeps_command_and_reports_its_phases(tmp_path, run_ranks):
    from firescale.report.formatting import ReportContext
    from firescale.report.memory_plots import write_accuracy_by_batch
    from firescale.report.summary import summarize
    from firescale.report.tables import to_markdown

    site, solver = scratch_local_site(tmp_path, run_ranks, max_iter=40)
    experiments = _with([phases((0, 8), (20, 16))])
    experiments["experiments"][EXAMPLE]["solver"] = str(solver)
    p = plan(experiments, site)
    point = p.point(EXAMPLE, "g1-b8+16at20-r0")
    argv = train_command(p, EXAMPLE, point)
    run_ranks(1, [sys.executable, "-m", "firescale", *argv[argv.index("train"):]])
    out = tmp_path / "results" / "local" / EXAMPLE / point.name
    result = json.loads((out / "result.json").read_text())
    assert result["iterations"] == 30           # 20 at 8, then the other 160 of the baseline's 320 images at 16
    assert [(s["iteration"], s["total_batch"], s["lr_scale"]) for s in result["batch"]["schedule"]] \
        == [(0, 8, 1.0), (20, 16, 2.0)]
    assert [e["iter"] for e in result["evals"]][-3:] == [10, 20, 30]
    record_path = tmp_path / "record.json"
    write_run_record(record_path, point_record(p, EXAMPLE, point), "succeeded", "", log_tail="", submissions=[],
                     train=result, status=None)
    record = read_run_record(record_path)
    summary = summarize([record], 0.02)
    written = write_accuracy_by_batch([(record.point, record.train)], tmp_path / "report", EXAMPLE)
    assert [w.name for w in written] == ["accuracy_by_batch.png", "accuracy_by_batch.pdf"]
    assert all(w.stat().st_size > 1000 for w in written)
    ctx = ReportContext(experiment=EXAMPLE, site="local", device="core", net="lenet_same", description="",
                        figures_beside=("accuracy_by_batch",))   # the report shows the figures written beside it
    text = to_markdown(summary, ctx, [])
    row = next(l for l in text.splitlines() if l.startswith("| g1-b8+16at20"))
    assert "| 8+16 |" in row and "![Top-1 accuracy against iterations, a line per batch phase" in text
