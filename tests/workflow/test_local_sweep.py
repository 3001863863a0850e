"""End to end on the `local` site: ingest digits, train the baseline on 1 rank and the sweep on 2, report."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

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


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One real, shortened run of `snakemake --profile local speedup_sweep` in a scratch directory."""
    work = tmp_path_factory.mktemp("sweep")
    (work / "short.yaml").write_text(SHORT_SOLVER)
    (work / "override.yaml").write_text(
        f"experiments:\n  digits-lenet:\n    solver: {work / 'short.yaml'}\n    target: {{tolerance: 0.05}}\n")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    profile = REPO / "site" / "local"  # the profile folder itself: same file `make setup` installs
    proc = subprocess.run(
        [str(BIN / "snakemake"), "speedup_sweep", "-s", str(REPO / "Snakefile"), "--directory", str(work),
         "--profile", str(profile), "--configfile", str(work / "override.yaml")],
        cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((work / "results").rglob("*.log")))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + logs
    return work


def _record(work, point):
    return json.loads((work / "results" / "local" / "digits-lenet" / "runs" / point / "result.json").read_text())


def test_baseline_and_two_rank_point_really_trained(sweep):
    baseline, point = _record(sweep, "baseline"), _record(sweep, "g2-b64-r0")
    assert baseline["outcome"] == point["outcome"] == "succeeded"
    assert baseline["train"]["ranks"] == 1 and point["train"]["ranks"] == 2
    assert baseline["train"]["evals"] and point["train"]["evals"]
    assert baseline["train"]["evals"][-1]["top1"] > 0.8
    # the 2-rank point's target is the baseline's final top-1 minus the tolerance
    assert point["train"]["target_top1"] == pytest.approx(baseline["train"]["evals"][-1]["top1"] - 0.05, abs=1e-6)
    status = json.loads((sweep / "results" / "local" / "digits-lenet" / "runs" / "g2-b64-r0" / "status.json").read_text())
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
    rows = json.loads((out / "report.json").read_text())
    text = json.dumps(rows)
    assert "g2-b64-r0" in text or '"gpus": 2' in text


def test_calibration_fits_communication_from_horovods_allreduce(sweep):
    """On a site without a scheduler the workflow times Horovod's allreduce of the net's gradients on the
    sweep's most ranks, so the 2-rank prediction carries a measured communication term."""
    cal = json.loads((sweep / "results" / "local" / "digits-lenet" / "calibration.json").read_text())
    comm = cal["comm_source"]
    assert comm["fitted"] is True and comm["measured"] == "horovod" and comm["ranks"] == 2
    assert comm["bytes"] == 524_320 and comm["seconds"] > 0     # LeNet on 8x8 digits: 131,080 float32
    assert 0 < cal["ppp_comm"] <= 1
    baseline = json.loads((sweep / "results" / "local" / "digits-lenet" / "runs" / "baseline" / "result.json").read_text())
    evaluations = len(baseline["train"]["evals"])
    eval_s = sum(s["eval_s"] for s in baseline["train"]["segments"])
    assert evaluations and cal["eval_s"] == pytest.approx(eval_s / evaluations)   # seconds per evaluation
    predicted = json.loads((sweep / "results" / "local" / "digits-lenet" / "predict-calibrated.json").read_text())
    two = predicted["points"]["g2-b64-r0"]
    assert two["iteration_s"] > comm["seconds"]
