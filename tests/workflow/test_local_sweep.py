"""End to end on the `local` site: ingest digits, train the baseline on 1 rank and the sweep on 2, report."""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]   # the experiment trains with TensorFlow

SHORT_SOLVER = """\
type: SGD
base_lr: 0.05
lr_policy: inv
gamma: 0.0001
power: 0.75
momentum: 0.9
weight_decay: 0.0005
max_iter: 400
test_interval: 100
display: 100
snapshot: 200
random_seed: 1
"""


# a project folder, as a clone holds one
PROJECT_FILES = ("Snakefile", "environment.yml", "workflow", "site", "templates")


def _project(work: Path) -> Path:
    """`work` made a project folder: the workflow, the sites and the templates of this checkout."""
    for name in PROJECT_FILES:
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy2)(REPO / name, work / name)
    return work


def _snakemake(work: Path, *args: str, configfiles: tuple[Path, ...] = (),
               timeout: int = 1200) -> subprocess.CompletedProcess:
    """Snakemake in the project folder `work` on its own workflow, with the `local` profile and the tests'
    experiment (override.yaml), then any more `configfiles`."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(BIN / "snakemake"), *args, "-s", str(work / "Snakefile"), "--directory", str(work),
         "--profile", str(work / "site" / "local"),
         "--configfile", str(work / "override.yaml"), *map(str, configfiles)],
        cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One real, shortened run of the workflow on the `local` profile in a scratch project folder: the tests'
    digits experiment (tests/workflow/digits-lenet.yaml) with two repeats of each point, up to its report."""
    work = _project(tmp_path_factory.mktemp("sweep"))
    (work / "short.yaml").write_text(SHORT_SOLVER)
    override = yaml.safe_load((REPO / "tests" / "workflow" / "digits-lenet.yaml").read_text())
    override["experiments"]["digits-lenet"].update(solver="short.yaml", target={"tolerance": 0.05}, repeats=2)
    (work / "override.yaml").write_text(yaml.safe_dump(override))
    proc = _snakemake(work, "reports/local/digits-lenet/report.md")
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((work / "results").rglob("*.log")))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + logs
    return work


def _record(work, point):
    return json.loads((work / "results" / "local" / "digits-lenet" / "runs" / point / "result.json").read_text())


def test_baseline_and_two_rank_point_really_trained(sweep):
    baseline, point = _record(sweep, "baseline"), _record(sweep, "g2-b64-r0")
    assert baseline["outcome"] == point["outcome"] == _record(sweep, "baseline-r1")["outcome"] == "succeeded"
    assert baseline["train"]["ranks"] == 1 and point["train"]["ranks"] == 2
    assert baseline["train"]["evals"] and point["train"]["evals"]
    assert baseline["train"]["evals"][-1]["top1"] > 0.8
    # a fixed-epoch budget: every run trains its whole max_iter (same batch: the same 400), no early stop
    assert baseline["train"]["iterations"] == point["train"]["iterations"] == 400
    assert point["train"]["target_top1"] is None and point["train"]["seed"] == 1
    assert _record(sweep, "g2-b64-r1")["train"]["seed"] == 2            # each repeat its own seed
    runs = sweep / "results" / "local" / "digits-lenet" / "runs"
    status = json.loads((runs / "g2-b64-r0" / "status.json").read_text())
    assert status["exit_code"] == 0 and status["ranks"] == 2


def test_dataset_was_ingested_into_both_formats_with_a_manifest(sweep):
    data = sweep / ".firescale-work" / "datasets" / "digits"
    manifest = json.loads((data / "manifest.json").read_text())
    assert (data / "train.lmdb").is_dir() and (data / "train.h5").is_file()
    assert "train" in json.dumps(manifest)


def test_report_shows_baseline_and_two_rank_run_with_parity(sweep):
    out = sweep / "reports" / "local" / "digits-lenet"
    for name in ("report.md", "report.tex", "report.html", "report.csv", "report.json", "speedup.png", "speedup.pdf"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    md = (out / "report.md").read_text()
    assert "baseline" in md.lower() and "local" in md
    data = json.loads((out / "report.json").read_text())
    base, two = data["rows"]
    assert base["points"] == ["baseline", "baseline-r1"] and two["points"] == ["g2-b64-r0", "g2-b64-r1"]
    # two runs on each side: the verdict and the speedup come with their intervals
    assert two["parity"]["interval_pts"] is not None
    assert two["parity"]["verdict"].split()[0] in ("MATCHES", "UNDECIDED", "BELOW")
    interval = two["speedup_interval"]
    assert interval["low"] <= two["speedup"]["mean"] <= interval["high"]
    assert "## Hyperparameters" in md and "Solver: SGD" in md


def test_report_shows_each_points_data_wait_as_its_real_runs_recorded_it(sweep):
    """The trainer times the wait for each batch separately from compute and the allreduce; the report
    gives every point's share of its iteration from those records (target under 2%)."""
    out = sweep / "reports" / "local" / "digits-lenet"
    rows = json.loads((out / "report.json").read_text())["rows"]
    for row in rows:
        splits = [_record(sweep, p)["train"]["per_iteration"] for p in row["points"]]
        waits = [s["data_wait_s"] for s in splits]
        assert all(0 < w < s["compute_s"] for w, s in zip(waits, splits)), row["points"]
        assert row["data_wait_s"]["mean"] == pytest.approx(sum(waits) / len(waits))
        # reading LeNet's 8x8 digits is inline and cheap
        assert row["data_wait_s"]["mean"] / row["iteration_s"]["mean"] < 0.10
    md = (out / "report.md").read_text()
    assert [row["group"] for row in rows] == ["baseline", "g2-b64"]
    each = ", ".join(f"{row['group']} {100 * row['data_wait_s']['mean'] / row['iteration_s']['mean']:.1f}%"
                     for row in rows)
    assert f"Waiting for data, in percent of each point's mean iteration as its runs recorded it: {each};" in md


def test_calibration_fits_communication_from_horovods_allreduce(sweep):
    """The workflow's calibration job times Horovod's allreduce of the net's gradients on the sweep's most
    ranks, so the 2-rank prediction carries a measured communication term.  On this site the job runs here."""
    cal = json.loads((sweep / "results" / "local" / "digits-lenet" / "calibration.json").read_text())
    job = sweep / ".firescale-work" / "results" / "local" / "digits-lenet" / "calibration"
    assert (sweep / "results" / "local" / "digits-lenet" / "jobs" / "calibration.sh").is_file()
    assert json.loads((job / "status.json").read_text())["exit_code"] == 0
    assert json.loads((job / "calibration.json").read_text()) == cal      # what the job wrote, collected whole
    assert (job / "work" / "allreduce-probe-2.json").is_file()      # the fastest of three probes
    comm = cal["comm_source"]
    assert comm["fitted"] is True and comm["measured"] == "horovod" and comm["ranks"] == 2
    # the fastest of three probes; a round the busy cores timed below zero is left out, null in rounds_s
    ran = [s for s in comm["rounds_s"] if s is not None]
    assert len(comm["rounds_s"]) == 3 and ran and comm["seconds"] == min(ran)
    assert comm["bytes"] == 524_320 and comm["seconds"] > 0     # LeNet on 8x8 digits: 131,080 float32
    assert 0 < cal["ppp_comm"] <= 1
    # the short run again on both cores at once: the node's contention, measured, in the calibration
    # (three rounds of it, the median taken)
    contended = cal["compute_source"]["contention"]
    assert contended["nodes"] == 1 and len(contended["rounds"]) == 3
    for round_ in contended["rounds"]:
        assert round_["copies"] == 2 and len(round_["loaded_s"]) == 2
        assert round_["batch"] == cal["compute_source"]["records"][-1]["batch_per_rank"]
        assert round_["ratio"] == pytest.approx(sum(round_["loaded_s"]) / 2 / round_["alone_s"])
        assert round_["factor"] == max(1.0, round_["ratio"])      # never faster than one alone
    assert contended["factor"] == statistics.median(r["factor"] for r in contended["rounds"])
    assert cal["contention"] == contended["factor"] and 1 <= cal["contention"] < 5
    # from both of the baseline's repeats (the report measures the baseline by their mean), then the short run
    # as often, one after the other; the copies are compared with the short runs' mean compute
    records = cal["compute_source"]["records"]
    assert [Path(r["source"]).parent.name for r in records] == ["baseline", "baseline-r1", "calibrate-b32",
                                                                "calibrate-b32-r1"]
    alone = [r["iteration_s"] - r["data_wait_s"] for r in records[2:]]
    assert all(round_["alone_s"] == pytest.approx(sum(alone) / 2, rel=1e-9) for round_ in contended["rounds"])
    source = cal["compute_source"]
    if "overhead_clamped" not in source and "compute_clamped" not in source:   # the fit goes through their mean
        ideal = source["runs"][0]["ideal_compute_s"]
        assert cal["overhead_s"] + ideal / cal["ppp_compute"] == pytest.approx(
            (records[0]["iteration_s"] + records[1]["iteration_s"]) / 2, rel=1e-6)
    baselines = [json.loads((sweep / "results" / "local" / "digits-lenet" / "runs" / name / "result.json").read_text())
                 for name in ("baseline", "baseline-r1")]
    evaluations = sum(len(b["train"]["evals"]) for b in baselines)
    eval_s = sum(s["eval_s"] for b in baselines for s in b["train"]["segments"])
    assert evaluations and cal["eval_s"] == pytest.approx(eval_s / evaluations)   # seconds per evaluation
    predicted = json.loads((sweep / "results" / "local" / "digits-lenet" / "predict-calibrated.json").read_text())
    two = predicted["points"]["g2-b64-r0"]
    assert two["iteration_s"] > comm["seconds"]


def test_the_report_rule_added_every_run_to_the_sites_store_once(sweep, capsys):
    from firescale.cli import main
    from firescale.store.database import open_store
    from firescale.store.select import Selection, select_runs

    store = sweep / ".firescale-work" / "results" / "firescale-results.sqlite"
    log = (sweep / "results" / "local" / "digits-lenet" / "logs" / "report.log").read_text()
    assert f"{store}: " in log and " runs added, 0 already there; no earlier sweep" in log
    opened = open_store(f"sqlite:///{store}", create=False)
    runs = select_runs(opened, Selection.parse("site=local,experiment=digits-lenet"))
    opened.close()
    records = sorted((sweep / "results" / "local" / "digits-lenet" / "runs").glob("*/result.json"))
    assert sorted(r.point for r in runs) == sorted(p.parent.name for p in records)
    assert {r.framework for r in runs} == {"tensorflow"} and {r.precision for r in runs} == {"fp32"}
    # the trainer recorded the checkout it ran from: this one
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert {r.commit.removesuffix("+dirty") for r in runs} == {commit.strip()}
    assert main(["results", "add", str(sweep / "results" / "local" / "digits-lenet"), "--store", str(store)]) == 0
    assert f"0 runs added, {len(records)} already there" in capsys.readouterr().out


def _planned(proc: subprocess.CompletedProcess) -> list[str]:
    """The outputs of every job a dry run plans."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return re.findall(r"^    output: (.+)$", proc.stdout, re.M)


def test_an_experiment_added_after_the_sweep_plans_only_its_own_jobs(sweep):
    """Each point's rules read that point's own description, so an experiment added beside a finished one
    leaves the finished one's jobs alone (and its descriptions untouched)."""
    before = {p: p.stat().st_mtime_ns for p in (sweep / "results" / "local" / "digits-lenet").rglob("*.yaml")}
    override = yaml.safe_load((sweep / "override.yaml").read_text())
    added = {**override["experiments"]["digits-lenet"], "sweep": {"gpus": [2], "batch": [32]}, "repeats": 1}
    mine = sweep / "mine.yaml"
    mine.write_text(yaml.safe_dump({"experiments": {"digits-added": added}}))
    proc = _snakemake(sweep, "reports/local/digits-lenet/report.md", "reports/local/digits-added/report.md",
                      "-n", configfiles=(mine,))
    planned = _planned(proc)
    assert planned and all("digits-added" in out for out in planned), planned
    runs = sorted(m for m in re.findall(r"results/local/([\w-]+/runs/[\w-]+)/result.json", proc.stdout))
    assert sorted(set(runs)) == ["digits-added/runs/baseline", "digits-added/runs/g2-b32-r0"]
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after == before


def test_a_moved_project_folder_plans_nothing_again(sweep, tmp_path):
    """The descriptions name the project's files relative to the project folder: the same sweep, moved
    (its files' times kept, as `mv` or `cp -a` keep them), is finished where it lands."""
    moved = tmp_path / "moved elsewhere"
    shutil.copytree(sweep, moved, symlinks=True)
    proc = _snakemake(moved, "reports/local/digits-lenet/report.md", "-n")
    assert _planned(proc) == [] and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    text = (moved / "results" / "local" / "digits-lenet" / "experiment.yaml").read_text()
    assert str(sweep) not in text and "solver: short.yaml" in text
