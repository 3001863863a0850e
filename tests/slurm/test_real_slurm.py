"""Rendered job scripts submitted to a real single-node Slurm, watched and collected by `sweep run`."""
from __future__ import annotations

import json
import sys

import pytest
from slurm_site import slurm_here

from firescale.jobs.render import render_job_script
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.spec import JobSpec
from firescale.sweep.records import PointRecord
from firescale.sweep.run import PointRun, Polling, collect

pytestmark = pytest.mark.slurm

RANK_CODE = (
    "import json, os, sys\n"
    "from mpi4py import MPI\n"
    "comm = MPI.COMM_WORLD\n"
    "total = comm.allreduce(comm.rank + 1)\n"
    "if comm.rank == 0:\n"
    "    json.dump({'status': 'finished', 'size': comm.size, 'sum': total,\n"
    "               'job': os.environ.get('SLURM_JOB_ID'), 'allreduce': os.environ['FIRESCALE_ALLREDUCE']},\n"
    "              open('result.json', 'w'))\n"
    "sys.exit(int(os.environ.get('FAIL_WITH', '0')))\n"
)


def _submit(tmp_path, monkeypatch, slurm, fail_with=0):
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    site = slurm_here(tmp_path)
    run = tmp_path / "run"
    job = JobSpec(name="fs-slurm-test", ranks=2, walltime_s=300, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=[sys.executable, "-c", RANK_CODE],
                  env={"FAIL_WITH": str(fail_with)})
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(site, job))
    lines: list[str] = []
    point_run = PointRun(scheduler=get_scheduler("slurm"), script=script, run_dir=run, max_resubmits=0,
                         polling=Polling(first=1, factor=1.5, most=5, status_wait=30), log=lines.append)
    verdict, subs = point_run.run()
    return verdict, subs, run, lines


def test_a_two_rank_job_runs_under_slurm_and_succeeds(tmp_path, monkeypatch, slurm):
    verdict, subs, run, lines = _submit(tmp_path, monkeypatch, slurm)
    log = (run / "job.log").read_text() if (run / "job.log").exists() else ""
    assert verdict.outcome == "succeeded", f"{verdict.reason}\n{log}\n" + "\n".join(lines)
    result = json.loads((run / "result.json").read_text())
    assert result["size"] == 2 and result["sum"] == 3 and result["allreduce"] == "tree"
    status = json.loads((run / "status.json").read_text())
    assert status["job_id"] == subs[0].job_id == result["job"] and status["exit_code"] == 0
    assert status["scheduler"] == "slurm" and len(status["hosts"]) == 1
    assert any("submitted" in l for l in lines)
    point = PointRecord(site="slurm-here", experiment="e", point="g2-b2-r0", gpus=2, nodes=1, batch=2, lr=0.1,
                        repeat=0, baseline=False, walltime="00:05:00", run_dir=str(run), max_resubmits=0)
    record = collect(point, verdict, subs, run, tmp_path / "out" / "result.json", tmp_path / "out" / "status.json")
    assert record["outcome"] == "succeeded" and record["train"]["size"] == 2 and record["queue_s"] >= 0


def test_a_failing_job_under_slurm_is_reported_failed(tmp_path, monkeypatch, slurm):
    verdict, subs, run, lines = _submit(tmp_path, monkeypatch, slurm, fail_with=5)
    assert verdict.outcome == "failed", "\n".join(lines)
    assert "exit code" in verdict.reason
    assert json.loads((run / "status.json").read_text())["exit_code"] != 0
