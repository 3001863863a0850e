"""End to end on the virtual cluster: `snakemake --profile vcluster speedup_sweep` submits the baseline, the
2-GPU point and the calibration job with sbatch, watches them with squeue, and the report's 2-GPU row ran on
two hosts.  The experiment trains with the pytorch backend here (on the MPI group between the nodes, which auto
takes for ranks srun --mpi=pmix starts), and is calibrated with the trainer's own allreduce: the sweep needs
neither TensorFlow nor Horovod.  The local sweep (tests/workflow) keeps the TensorFlow backend."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.vcluster, pytest.mark.slow, pytest.mark.pytorch]   # no TensorFlow, no Horovod needed

EXPERIMENT = "fashion-lenet"  # the default experiment of workflow/config.yaml, its own solver unchanged


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, vcluster):
    """One real `snakemake --profile vcluster speedup_sweep` of the default experiment (its site entry:
    the baseline and the 2-GPU point at batch 64, one run each) in a scratch directory whose
    .firescale-work/vcluster is the test cluster (where site/vcluster expects its clients)."""
    work = tmp_path_factory.mktemp("vcsweep")
    (work / ".firescale-work").mkdir()
    (work / ".firescale-work" / "vcluster").symlink_to(vcluster.root)
    (work / "override.yaml").write_text(f"experiments:\n  {EXPERIMENT}:\n    target: {{tolerance: 0.05}}\n"
                                        "    framework: pytorch\n")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [str(BIN / "snakemake"), "speedup_sweep", "-s", str(REPO / "Snakefile"), "--directory", str(work),
         "--profile", str(REPO / "site" / "vcluster"), "--configfile", str(work / "override.yaml")],
        cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((work / "results").rglob("*.log")))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + logs
    return work


def _record(work: Path, point: str) -> dict:
    return json.loads((work / "results" / "vcluster" / EXPERIMENT / "runs" / point / "result.json").read_text())


def test_two_gpu_point_ran_as_two_nodes_of_one_rank(sweep):
    baseline, point = _record(sweep, "baseline"), _record(sweep, "g2-b64-r0")
    assert baseline["outcome"] == point["outcome"] == "succeeded", (baseline["reason"], point["reason"])
    assert point["nodes"] == 2 and point["train"]["ranks"] == 2
    assert sorted(point["train"]["hostnames"]) == ["n1", "n2"]           # where the ranks really ran
    assert point["status"]["hosts"] == ["n1", "n2"]                   # the allocation
    assert baseline["train"]["hostnames"] in (["n1"], ["n2"])
    # submitted to Slurm, not run here: a numeric Slurm job id for every submission
    assert all(s["job_id"].isdigit() for s in point["submissions"] + baseline["submissions"])
    # a fixed-epoch budget: both train the solver's whole max_iter at the same batch, to a useful accuracy
    assert baseline["train"]["iterations"] == point["train"]["iterations"] == 469
    assert point["train"]["evals"][-1]["top1"] > 0.7
    # trained by the pytorch backend, its two ranks summing over the MPI group (Open MPI) across the bridge
    assert point["train"]["versions"]["framework"] == baseline["train"]["versions"]["framework"] == "pytorch"
    assert point["train"]["versions"]["process_group"] == "mpi"
    assert point["train"]["allreduce"]["library"] == "openmpi" and point["train"]["allreduce"]["ranks"] == 2


def test_report_row_of_the_two_gpu_point_names_two_nodes(sweep):
    out = sweep / "reports" / "vcluster" / EXPERIMENT
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| g2-b64"))
    assert "vcluster, 2 nodes; pytorch, fp32" in row and "MATCHES" in row
    rows = json.loads((out / "report.json").read_text())
    assert "n2" in json.dumps(rows)


def test_the_calibration_job_measured_on_the_two_gpu_points_nodes(sweep):
    """The calibration ran in a job of as many nodes as the 2-GPU point: its short run on the first (the
    baseline's trainer, pytorch), and the allreduce the pytorch trainer pays, its ranks' MPI process group
    (srun --mpi=pmix starts MPI ranks, so auto takes it, as the points' runs do), of LeNet's gradients over
    both; with one rank a node there is no contention to measure."""
    cal = json.loads((sweep / "results" / "vcluster" / EXPERIMENT / "calibration.json").read_text())
    job = sweep / ".firescale-work" / "results" / "vcluster" / EXPERIMENT / "calibration"
    status = json.loads((job / "status.json").read_text())
    assert status["exit_code"] == 0 and status["hosts"] == ["n1", "n2"] and status["job_id"].isdigit()
    comm = cal["comm_source"]
    assert comm["fitted"] is True and comm["measured"] == "torch" and comm["ranks"] == 2 and comm["seconds"] > 0
    probe = json.loads((job / "work" / "allreduce-probe-0.json").read_text())
    assert [(m["algorithm"], m["ranks"], m["process_group"]) for m in probe["measurements"]] == [("torch", 2, "mpi")]
    assert [r["batch_per_rank"] for r in cal["compute_source"]["records"]] == [64, 32]   # baseline, short run
    assert "contention" not in cal["compute_source"] and cal["contention"] == 1.0
