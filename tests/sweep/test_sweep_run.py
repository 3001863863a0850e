"""Submit, poll, resubmit and collect against a fake Slurm and PBS whose job states the tests set."""
from __future__ import annotations

import json

import pytest
from fake_scheduler import FakeJob, FakeScheduler

from firescale.errors import FirescaleError
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.schedulers.base import RUNNING, TIMEOUT
from firescale.jobs.schedulers.pbs import parse_qstat_f
from firescale.sweep.records import PointRecord
from firescale.sweep.run import PointRun, Polling, collect

OK_STATUS = {"exit_code": 0, "signal": "", "start": "2026-01-01T00:01:00Z", "end": "2026-01-01T00:05:00Z",
             "hosts": ["n1"]}
RESULT = {"status": "target_reached", "time_to_accuracy_s": 100.0}


def _run(tmp_path, scheduler_name, jobs, max_resubmits=2):
    fake = FakeScheduler(run_dir=tmp_path / "run", script=list(jobs))
    lines, sleeps = [], []
    point_run = PointRun(scheduler=get_scheduler(scheduler_name, fake), script=tmp_path / "job.sh",
                         run_dir=tmp_path / "run", max_resubmits=max_resubmits,
                         polling=Polling(first=5, factor=2, most=30, status_wait=3),
                         log=lines.append, sleep=sleeps.append)
    verdict, subs = point_run.run()
    return verdict, subs, fake, lines, sleeps


@pytest.mark.parametrize("scheduler,states", [
    ("slurm", ["PENDING", "PENDING", "RUNNING", "RUNNING", "COMPLETED"]),
    ("pbs", ["Q", "Q", "R", "R", "C"]),
    ("torque", ["Q", "Q", "R", "R", "C"]),
])
def test_pending_running_completed_succeeds(tmp_path, scheduler, states):
    verdict, subs, fake, lines, sleeps = _run(tmp_path, scheduler, [FakeJob(states, OK_STATUS, RESULT)])
    assert verdict.outcome == "succeeded"
    assert len(subs) == 1 and subs[0].exit_code == 0 and subs[0].started == OK_STATUS["start"]
    assert subs[0].queue_s is not None
    # one log line per state change, not per poll
    assert sum("PENDING" in l for l in lines) == 1 and sum("RUNNING" in l for l in lines) == 1
    assert sleeps[:4] == [5, 10, 20, 30] and max(sleeps) <= 30  # kind to the scheduler: it backs off


def test_failed_job_is_failed_with_its_exit_code(tmp_path):
    status = {**OK_STATUS, "exit_code": 2}
    verdict, subs, *_ = _run(tmp_path, "slurm", [FakeJob(["RUNNING", "FAILED"], status)])
    assert verdict.outcome == "failed" and "exit code 2" in verdict.reason and "FAILED" in verdict.reason


def test_qsub_success_is_not_job_success(tmp_path):
    # qsub returned 0, the job ran and failed: the status file decides.
    verdict, *_ = _run(tmp_path, "pbs", [FakeJob(["Q", "R", "C"], {**OK_STATUS, "exit_code": 1})])
    assert verdict.outcome == "failed" and "exit code 1" in verdict.reason


def test_walltime_timeout_is_resubmitted_from_the_snapshot(tmp_path):
    killed = {**OK_STATUS, "exit_code": 143, "signal": "USR1"}
    jobs = [FakeJob(["RUNNING", "TIMEOUT"], killed, {"status": "interrupted"}, snapshot=400),
            FakeJob(["PENDING", "RUNNING", "COMPLETED"], OK_STATUS, RESULT)]
    verdict, subs, fake, lines, _ = _run(tmp_path, "slurm", jobs)
    assert verdict.outcome == "succeeded"
    assert [s.state for s in subs] == ["TIMEOUT", "COMPLETED"]
    assert sum(c[0] == "sbatch" for c in fake.calls) == 2
    assert any("resubmitting" in l for l in lines)
    assert (tmp_path / "run" / "status.attempt-0.json").exists()  # the first attempt's status is kept


def test_torque_walltime_exit_status_is_a_timeout(tmp_path):
    assert parse_qstat_f("job_state = C\n exit_status = -11\n", "torque").state == TIMEOUT
    assert parse_qstat_f("    job_state = R\n", "torque").state == RUNNING


def test_resubmissions_stop_at_the_limit(tmp_path):
    killed = {**OK_STATUS, "exit_code": 143, "signal": "USR1"}
    jobs = [FakeJob(["RUNNING", "TIMEOUT"], killed, {"status": "interrupted"}, snapshot=100 * k) for k in (1, 2, 3)]
    verdict, subs, *_ = _run(tmp_path, "slurm", jobs, max_resubmits=2)
    assert verdict.outcome == "failed" and "after 2 resubmissions" in verdict.reason and len(subs) == 3


def test_vanished_job_without_status_fails_plainly_and_is_cancelled(tmp_path):
    job = FakeJob(["PENDING", "RUNNING", "GONE"], status=None, accounting=False)
    verdict, subs, fake, *_ = _run(tmp_path, "slurm", [job])
    assert verdict.outcome == "failed"
    assert "without writing status.json" in verdict.reason and "accounting is disabled" in verdict.reason
    assert fake.cancelled == ["1000"] and "was cancelled" in verdict.reason  # never left running unwatched


def test_vanished_job_with_a_good_status_file_succeeds_without_accounting(tmp_path):
    # A Slurm without accounting (sacct knows nothing): trust the status file the job wrote.
    job = FakeJob(["RUNNING", "COMPLETED"], OK_STATUS, RESULT, accounting=False)
    verdict, *_ = _run(tmp_path, "slurm", [job])
    assert verdict.outcome == "succeeded"


def test_pbs_job_gone_from_qstat_uses_history_then_status(tmp_path):
    job = FakeJob(["Q", "R", "F"], {**OK_STATUS, "exit_code": 0}, RESULT, accounting=True)
    verdict, subs, fake, *_ = _run(tmp_path, "pbs", [job])
    assert verdict.outcome == "succeeded"
    assert any("-x" in c for c in fake.calls if c[0] == "qstat")


def test_exit_zero_without_a_result_is_a_failure(tmp_path):
    verdict, *_ = _run(tmp_path, "slurm", [FakeJob(["RUNNING", "COMPLETED"], OK_STATUS, None)])
    assert verdict.outcome == "failed" and "no finished result.json" in verdict.reason


def test_a_refused_submission_says_why(tmp_path):
    fake = FakeScheduler(run_dir=tmp_path / "run", submit_fails=True)
    run = PointRun(scheduler=get_scheduler("slurm", fake), script=tmp_path / "job.sh", run_dir=tmp_path / "run",
                   max_resubmits=0, log=lambda l: None, sleep=lambda s: None)
    with pytest.raises(FirescaleError, match="sbatch failed .*Invalid account"):
        run.run()


def test_cancel_cancels_the_submitted_job(tmp_path):
    fake = FakeScheduler(run_dir=tmp_path / "run", script=[FakeJob(["PENDING"] * 50, None)])
    run = PointRun(scheduler=get_scheduler("slurm", fake), script=tmp_path / "job.sh", run_dir=tmp_path / "run",
                   max_resubmits=0, log=lambda l: None)

    def interrupt(seconds):
        run.cancel_current()
        raise KeyboardInterrupt

    run.sleep = interrupt
    with pytest.raises(KeyboardInterrupt):
        run.run()
    assert fake.cancelled == ["1000"]


def test_collect_writes_the_run_record_and_the_failure_reason(tmp_path):
    status = {**OK_STATUS, "exit_code": 3}
    verdict, subs, *_ = _run(tmp_path, "slurm", [FakeJob(["RUNNING", "FAILED"], status)])
    (tmp_path / "run" / "job.log").write_text("line 1\nTraceback: boom\n")
    point = PointRecord(site="s", experiment="e", point="g2-b64-r0", gpus=2, nodes=1, batch=64, lr=0.1, repeat=0,
                        baseline=False, walltime="00:10:00", run_dir=str(tmp_path / "run"), max_resubmits=2)
    out = tmp_path / "collected"
    record = collect(point, verdict, subs, tmp_path / "run", out / "result.json", out / "status.json")
    saved = json.loads((out / "result.json").read_text())
    assert saved == json.loads(json.dumps(record))
    assert saved["outcome"] == "failed" and "exit code 3" in saved["reason"]
    assert "Traceback: boom" in saved["log_tail"] and saved["train"] is None
    assert json.loads((out / "status.json").read_text())["exit_code"] == 3
