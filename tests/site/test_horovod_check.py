"""A GPU site's job checks Horovod's build before training: without NCCL it fails with one sentence."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from site_helpers import site_copy

from firescale.cluster.site import load_site
from firescale.jobs.render import render_job_script
from firescale.jobs.spec import JobSpec

CHECK = "firescale site check-horovod --gpu-operations NCCL"


def _job(run: Path) -> JobSpec:
    return JobSpec(name="gpu-body", ranks=1, walltime_s=60, workdir=run, log_file=run / "job.log",
                   status_file=run / "status.json",
                   command=[sys.executable, "-c", "import pathlib; pathlib.Path('trained').write_text('1')"])


def _gpu_local(tmp_path: Path):
    """This machine as a site whose nodes have GPUs."""
    def gpus(site: dict) -> None:
        site.update(name="gpu-local")
        site["device"].update(kind="gpu")

    return load_site(site_copy(tmp_path, "local", gpus, folder="gpu-local"))


def test_only_gpu_sites_check_the_build(tmp_path):
    run = tmp_path / "run"
    assert CHECK in render_job_script(_gpu_local(tmp_path), _job(run))
    assert "check-horovod" not in render_job_script(load_site("local"), _job(run))
    container = load_site(site_copy(tmp_path, "ib-cluster", lambda d: (d.update(name="in-container"), d[
        "environment"].update(container={"image": "/img/fs.sif", "options": ["--nv"]})), folder="in-container"))
    assert f"apptainer exec --nv /img/fs.sif {CHECK}" in render_job_script(container, _job(run))


def test_a_pytorch_job_on_a_gpu_site_checks_no_horovod_and_trains(tmp_path):
    """A PyTorch job sums over torch.distributed: a GPU site's job runs it without asking Horovod anything, so
    a node with no Horovod trains (here the job body runs for real; this machine's Horovod is not asked)."""
    from dataclasses import replace

    run = tmp_path / "run"
    site = _gpu_local(tmp_path)
    job = replace(_job(run), framework="pytorch")
    body = render_job_script(site, job)
    assert "check-horovod" not in body and CHECK in render_job_script(site, _job(run))
    script = tmp_path / "job.sh"
    script.write_text(body)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run / "trained").read_text() == "1" and json.loads((run / "status.json").read_text())["exit_code"] == 0


def test_a_sweeps_pytorch_points_and_calibration_on_a_gpu_site_are_pytorch_jobs(tmp_path, monkeypatch):
    import yaml

    from firescale.sweep.jobs import calibration_job, job_for_point
    from firescale.sweep.plan import SweepPlan

    repo = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((repo / "workflow" / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    for framework in ("tensorflow", "pytorch"):
        config["experiments"]["nin-imagenet"]["framework"] = framework
        plan = SweepPlan.build({**config, "site": "titan"}, base=repo)
        jobs = [job_for_point(plan, "nin-imagenet", p) for p in plan.points["nin-imagenet"]]
        jobs.append(calibration_job(plan, "nin-imagenet"))
        assert {j.framework for j in jobs} == {framework}
        checked = {"check-horovod" in render_job_script(plan.site, j) for j in jobs}
        assert checked == {framework == "tensorflow"}


@pytest.mark.tensorflow
def test_a_gpu_site_s_job_fails_before_training_when_horovod_lacks_nccl(tmp_path):
    """This machine's Horovod has MPI and Gloo, no NCCL: the real job body on a GPU site stops at the check."""
    run = tmp_path / "run"
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(_gpu_local(tmp_path), _job(run)))
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 78, proc.stdout + proc.stderr
    status = json.loads((run / "status.json").read_text())
    reason = status["reason"]
    assert status["exit_code"] == 78 and "was built without NCCL (it carries MPI, Gloo)" in reason
    assert "this job's site has GPUs" in reason and "make setup GPU=1" in reason and ". " not in reason
    assert f"firescale: {reason}" in proc.stderr
    assert not (run / "trained").exists() and "starts" not in proc.stdout   # the ranks never started
