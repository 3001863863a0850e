"""End to end on the virtual cluster: `snakemake --profile vcluster speedup_sweep` submits the baseline and
the 2-GPU point with sbatch, watches them with squeue, and the report's 2-GPU row ran on two hosts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.vcluster, pytest.mark.slow]

SHORT_SOLVER = """\
type: SGD
base_lr: 0.05
lr_policy: inv
gamma: 0.0001
power: 0.75
momentum: 0.9
weight_decay: 0.0005
max_iter: 300
test_interval: 100
display: 100
snapshot: 200
random_seed: 1
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, vcluster):
    """One real, shortened `snakemake --profile vcluster speedup_sweep` in a scratch directory whose
    .firescale-work/vcluster is the test cluster (where site/vcluster expects its clients)."""
    work = tmp_path_factory.mktemp("vcsweep")
    (work / ".firescale-work").mkdir()
    (work / ".firescale-work" / "vcluster").symlink_to(vcluster.root)
    (work / "short.yaml").write_text(SHORT_SOLVER)
    (work / "override.yaml").write_text(
        f"experiments:\n  digits-lenet:\n    solver: {work / 'short.yaml'}\n    target: {{tolerance: 0.05}}\n")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [str(BIN / "snakemake"), "speedup_sweep", "-s", str(REPO / "Snakefile"), "--directory", str(work),
         "--profile", str(REPO / "site" / "vcluster"), "--configfile", str(work / "override.yaml")],
        cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((work / "results").rglob("*.log")))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + logs
    return work


def _record(work: Path, point: str) -> dict:
    return json.loads((work / "results" / "vcluster" / "digits-lenet" / "runs" / point / "result.json").read_text())


def test_two_gpu_point_ran_as_two_nodes_of_one_rank(sweep):
    baseline, point = _record(sweep, "baseline"), _record(sweep, "g2-b64-r0")
    assert baseline["outcome"] == point["outcome"] == "succeeded", (baseline["reason"], point["reason"])
    assert point["nodes"] == 2 and point["train"]["ranks"] == 2
    assert sorted(point["train"]["hostnames"]) == ["n1", "n2"]           # where the ranks really ran
    assert point["status"]["hosts"] == ["n1", "n2"]                   # the allocation
    assert baseline["train"]["hostnames"] in (["n1"], ["n2"])
    # submitted to Slurm, not run here: a numeric Slurm job id for every submission
    assert all(s["job_id"].isdigit() for s in point["submissions"] + baseline["submissions"])
    assert point["train"]["evals"][-1]["top1"] >= point["train"]["target_top1"]


def test_report_row_of_the_two_gpu_point_names_two_nodes(sweep):
    out = sweep / "reports" / "vcluster" / "digits-lenet"
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| g2-b64"))
    assert "vcluster, 2 nodes" in row and "MATCHES" in row
    rows = json.loads((out / "report.json").read_text())
    assert "n2" in json.dumps(rows)
