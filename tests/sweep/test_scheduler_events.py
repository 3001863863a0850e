"""Each scheduler event of issue 11 against the fake Slurm and PBS: what the runner does and why."""
from __future__ import annotations

import pytest
from fake_scheduler import FakeJob, FakeScheduler

from firescale.jobs.outcome import ResubmitRules
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.schedulers.base import OUT_OF_MEMORY, TIMEOUT
from firescale.jobs.schedulers.pbs import parse_qstat_f
from firescale.sweep.run import PointRun, Polling

START = "2026-01-01T00:00:00Z"
OK = {"exit_code": 0, "signal": "", "signal_time": "", "start": START, "end": "2026-01-01T00:20:00Z"}
DONE = {"status": "target_reached"}
# A one-hour job on a site that sends USR1 300 s before walltime (due at 00:55:00).
HOUR = ResubmitRules(walltime_s=3600, signal="USR1", lead_s=300)


def signalled(name: str, at: str, code: int = 143) -> dict:
    return {**OK, "exit_code": code, "signal": name, "signal_time": f"2026-01-01T{at}Z"}


def run(tmp_path, jobs, scheduler="slurm", rules=HOUR, max_resubmits=3, **polling):
    fake = FakeScheduler(run_dir=tmp_path / "run", script=list(jobs))
    lines, sleeps = [], []
    point = PointRun(scheduler=get_scheduler(scheduler, fake), script=tmp_path / "job.sh", run_dir=tmp_path / "run",
                     max_resubmits=max_resubmits, log=lines.append, sleep=sleeps.append, rules=rules,
                     polling=Polling(first=5, factor=2, most=30, status_wait=3, **polling))
    verdict, subs = point.run()
    return verdict, subs, fake, lines, sleeps


def submissions(fake) -> int:
    return sum(c[0] in ("sbatch", "qsub") for c in fake.calls)


# ---------------------------------------------------------------- 1. the scheduler does not answer


def test_one_failed_squeue_while_running_is_asked_again_and_the_job_left_alone(tmp_path):
    job = FakeJob(["PENDING", "RUNNING", "RUNNING", "COMPLETED"], OK, DONE, accounting=False, failing_queries={2})
    verdict, subs, fake, lines, sleeps = run(tmp_path, [job])
    assert verdict.outcome == "succeeded" and fake.cancelled == []
    assert any("did not answer" in l and "connect failure" in l for l in lines)
    assert any("answers again" in l for l in lines)


def test_sacct_failing_after_the_job_left_the_queue_is_asked_again(tmp_path):
    job = FakeJob(["RUNNING", "COMPLETED"], OK, DONE, failing_sacct={0, 1})
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "succeeded" and subs[0].state == "COMPLETED" and fake.cancelled == []


def test_a_scheduler_silent_too_long_gets_the_job_cancelled_and_the_point_failed(tmp_path):
    job = FakeJob(["PENDING", "RUNNING"] + ["RUNNING"] * 5, accounting=False, failing_queries=set(range(2, 500)))
    verdict, subs, fake, lines, sleeps = run(tmp_path, [job], give_up_after=300)
    assert verdict.outcome == "failed" and "stopped answering" in verdict.reason
    assert "connect failure" in verdict.reason and "no answer for 3" in verdict.reason
    assert fake.cancelled == ["1000"] and "was cancelled" in verdict.reason
    retries = sleeps[2:]  # after PENDING and RUNNING were answered: backoff 5, 10, 20, 30, 30, ...
    assert retries[:4] == [5, 10, 20, 30] and max(retries) == 30 and submissions(fake) == 1


def test_a_cancel_that_fails_is_retried_and_one_that_never_works_is_reported(tmp_path):
    silent = lambda: FakeJob(["RUNNING", "RUNNING"], failing_queries=set(range(1, 500)))  # noqa: E731
    fake = FakeScheduler(run_dir=tmp_path / "a", script=[silent()], cancel_failures=2)
    point = PointRun(scheduler=get_scheduler("slurm", fake), script=tmp_path / "job.sh", run_dir=tmp_path / "a",
                     max_resubmits=0, log=lambda l: None, sleep=lambda s: None,
                     polling=Polling(first=5, give_up_after=60))
    verdict, _ = point.run()
    assert fake.cancelled == ["1000"] and sum(c[0] == "scancel" for c in fake.calls) == 3
    fake = FakeScheduler(run_dir=tmp_path / "b", script=[silent()], cancel_failures=99)
    point.scheduler, point.run_dir = get_scheduler("slurm", fake), tmp_path / "b"
    verdict, _ = point.run()
    assert verdict.outcome == "failed" and "could NOT be cancelled" in verdict.reason
    assert "cancel it by hand" in verdict.reason


def test_a_moments_absence_from_the_queue_is_not_an_end(tmp_path):
    job = FakeJob(["RUNNING", "GONE", "RUNNING", "RUNNING", "COMPLETED"], OK, DONE, accounting=False)
    verdict, subs, fake, lines, _ = run(tmp_path, [job])
    assert verdict.outcome == "succeeded" and fake.cancelled == []
    assert sum(c[0] == "squeue" for c in fake.calls) >= 5  # it kept asking after the absence


def test_an_end_is_believed_when_answers_agree(tmp_path):
    job = FakeJob(["RUNNING", "COMPLETED"], OK, DONE)
    verdict, subs, fake, *_ = run(tmp_path, [job], confirm=3)
    assert verdict.outcome == "succeeded" and sum(c[0] == "sacct" for c in fake.calls) == 3


def test_a_job_no_one_knows_needs_one_more_answer_before_the_runner_gives_up(tmp_path):
    job = FakeJob(["RUNNING", "GONE"], None, accounting=False)
    verdict, subs, fake, *_ = run(tmp_path, [job], confirm=2)
    assert verdict.outcome == "failed" and sum(c[0] == "sacct" for c in fake.calls) == 3
    assert fake.cancelled == ["1000"]


def test_pbs_qstat_failing_is_asked_again(tmp_path):
    job = FakeJob(["Q", "R", "R", "F"], OK, DONE, failing_queries={1, 2})
    verdict, subs, fake, lines, _ = run(tmp_path, [job], scheduler="pbs")
    assert verdict.outcome == "succeeded" and fake.cancelled == []
    assert any("cannot connect to server" in l for l in lines)


# ---------------------------------------------------------------- 2. what may resubmit


def test_a_users_scancel_fails_the_point_and_is_not_resubmitted(tmp_path):
    job = FakeJob(["RUNNING", "CANCELLED"], signalled("TERM", "00:10:00"), {"status": "interrupted"}, snapshot=50)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed" and "cancelled by a user" in verdict.reason and submissions(fake) == 1


def test_a_cancel_is_not_resubmitted_even_where_the_walltime_signal_is_term(tmp_path):
    term_site = ResubmitRules(walltime_s=3600, signal="TERM", lead_s=300)
    job = FakeJob(["RUNNING", "CANCELLED"], signalled("TERM", "00:56:00"), snapshot=50)
    verdict, subs, fake, *_ = run(tmp_path, [job], rules=term_site)
    assert verdict.outcome == "failed" and submissions(fake) == 1


def test_term_long_before_walltime_is_a_stop_request_not_walltime(tmp_path):
    job = FakeJob(["RUNNING", "FAILED"], signalled("TERM", "00:10:00"), snapshot=50)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed" and submissions(fake) == 1
    assert "SIGTERM 00:10:00 after the job started, not the walltime signal SIGUSR1" in verdict.reason


def test_an_oom_killed_step_exiting_143_fails_the_point(tmp_path):
    job = FakeJob(["RUNNING", "OUT_OF_MEMORY"], {**OK, "exit_code": 143}, snapshot=50)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed" and "out of memory" in verdict.reason and submissions(fake) == 1


def test_an_exit_code_alone_never_resubmits(tmp_path):
    job = FakeJob(["RUNNING", "FAILED"], {**OK, "exit_code": 143}, snapshot=50)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed" and "exit code 143, killed by SIGTERM" in verdict.reason


@pytest.mark.parametrize("at", ["00:55:00", "00:54:00", "00:59:30"])
def test_the_walltime_signal_within_its_lead_time_resubmits(tmp_path, at):
    first = FakeJob(["RUNNING", "FAILED"], signalled("USR1", at), {"status": "interrupted"}, snapshot=300)
    verdict, subs, fake, lines, _ = run(tmp_path, [first, FakeJob(["RUNNING", "COMPLETED"], OK, DONE)])
    assert verdict.outcome == "succeeded" and submissions(fake) == 2
    assert any("resubmitting from the snapshot at iteration 300" in l and "walltime signal SIGUSR1" in l for l in lines)


def test_a_walltime_signal_after_the_last_iteration_is_not_resubmitted(tmp_path):
    # Seen under a real Slurm: training wrote its finished result, then the signal came while the job ended.
    job = FakeJob(["RUNNING", "FAILED"], signalled("USR1", "00:56:00"), DONE, snapshot=300)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "succeeded" and submissions(fake) == 1
    assert verdict.reason == "training finished before the walltime signal SIGUSR1 00:56:00 after the job started " \
                             "(due at 00:55:00, walltime 01:00:00) ended the job"


def test_the_walltime_signal_long_before_its_time_fails_the_point(tmp_path):
    job = FakeJob(["RUNNING", "FAILED"], signalled("USR1", "00:20:00"), {"status": "interrupted"}, snapshot=100)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed" and submissions(fake) == 1
    assert "SIGUSR1 00:20:00 after the job started, before the walltime signal was due (00:55:00)" in verdict.reason


@pytest.mark.parametrize("word", ["TIMEOUT", "PREEMPTED"])
def test_timeout_and_preemption_resubmit(tmp_path, word):
    first = FakeJob(["RUNNING", word], None, snapshot=10)
    verdict, subs, fake, *_ = run(tmp_path, [first, FakeJob(["RUNNING", "COMPLETED"], OK, DONE)])
    assert verdict.outcome == "succeeded" and [s.state for s in subs] == [word, "COMPLETED"]


def test_node_fail_fails_the_point_unless_the_site_resubmits_it(tmp_path):
    lost = lambda: FakeJob(["RUNNING", "NODE_FAIL"], None, snapshot=20)  # noqa: E731
    verdict, subs, fake, *_ = run(tmp_path / "a", [lost()])
    assert verdict.outcome == "failed" and "a node of the job failed" in verdict.reason
    assert "NODE_FAIL" in verdict.reason and "resubmit_on_node_fail" in verdict.reason and submissions(fake) == 1
    resubmitting = ResubmitRules(walltime_s=3600, signal="USR1", lead_s=300, node_fail=True)
    verdict, _subs, fake, *_ = run(tmp_path / "b", [lost(), FakeJob(["RUNNING", "COMPLETED"], OK, DONE)],
                                   rules=resubmitting)
    assert verdict.outcome == "succeeded" and submissions(fake) == 2


def test_a_lost_rank_fails_the_point_with_the_reason(tmp_path):
    # mpirun (or srun --kill-on-bad-exit) ends the job when one rank is killed; the job writes its status.
    job = FakeJob(["RUNNING", "FAILED"], {**OK, "exit_code": 137}, snapshot=20)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed" and submissions(fake) == 1
    assert "exit code 137, killed by SIGKILL" in verdict.reason and "scheduler state FAILED" in verdict.reason


def test_the_jobs_own_reason_is_kept(tmp_path):
    job = FakeJob(["RUNNING", "FAILED"], {**OK, "exit_code": 78, "reason": "srun has no MPI plugin pmix"})
    verdict, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed"
    assert verdict.reason.endswith("scheduler state FAILED: srun has no MPI plugin pmix")


def test_a_node_lost_with_the_batch_host_leaves_no_status_and_still_fails_with_the_reason(tmp_path):
    job = FakeJob(["RUNNING", "NODE_FAIL"], None, exit_status=0)
    verdict, subs, fake, *_ = run(tmp_path, [job])
    assert verdict.outcome == "failed" and "NODE_FAIL" in verdict.reason and fake.cancelled == []


@pytest.mark.parametrize("code,state,words", [
    (-29, TIMEOUT, "JOB_EXEC_KILL_WALLTIME"), (-27, OUT_OF_MEMORY, "JOB_EXEC_KILL_MEM"),
    (271, "FAILED", "killed by SIGTERM"), (0, "COMPLETED", "")])
def test_pbs_pro_exit_statuses(code, state, words):
    parsed = parse_qstat_f(f"    job_state = F\n    Exit_status = {code}\n", "pbs")
    assert parsed.state == state and words in parsed.raw


@pytest.mark.parametrize("code,state", [(-11, TIMEOUT), (-10, OUT_OF_MEMORY), (265, "FAILED"), (0, "COMPLETED")])
def test_torque_exit_statuses(code, state):
    assert parse_qstat_f(f"    job_state = C\n    exit_status = {code}\n", "torque").state == state


def test_pbs_pro_walltime_kill_resubmits_and_its_memory_kill_fails(tmp_path):
    timed_out = FakeJob(["Q", "R", "F"], {**OK, "exit_code": 271}, exit_status=-29, snapshot=40)
    verdict, subs, fake, *_ = run(tmp_path / "a", [timed_out, FakeJob(["R", "F"], OK, DONE)], scheduler="pbs")
    assert verdict.outcome == "succeeded" and submissions(fake) == 2
    oom = FakeJob(["Q", "R", "F"], {**OK, "exit_code": 271}, exit_status=-27, snapshot=40)
    verdict, subs, fake, *_ = run(tmp_path / "b", [oom], scheduler="pbs")
    assert verdict.outcome == "failed" and "out of memory" in verdict.reason and "JOB_EXEC_KILL_MEM" in verdict.reason


def test_torque_has_no_history_query(tmp_path):
    job = FakeJob(["Q", "R", "C"], OK, DONE)
    verdict, subs, fake, *_ = run(tmp_path, [job], scheduler="torque")
    assert verdict.outcome == "succeeded" and not any("-x" in c for c in fake.calls)
    assert fake.calls[0][:2] == ["qsub", "-d"]


# ---------------------------------------------------------------- 5. bounded, and always moving forward


def test_an_attempt_that_does_not_advance_the_snapshot_stops_the_loop(tmp_path):
    jobs = [FakeJob(["RUNNING", "TIMEOUT"], None, snapshot=100), FakeJob(["RUNNING", "TIMEOUT"], None, snapshot=100)]
    verdict, subs, fake, *_ = run(tmp_path, jobs)
    assert verdict.outcome == "failed" and submissions(fake) == 2
    assert "attempt 1 wrote no snapshot newer than the one at iteration 100" in verdict.reason


def test_a_first_attempt_without_any_snapshot_is_not_resubmitted(tmp_path):
    verdict, subs, fake, *_ = run(tmp_path, [FakeJob(["RUNNING", "TIMEOUT"], None)])
    assert verdict.outcome == "failed" and "no snapshot newer than none" in verdict.reason and submissions(fake) == 1


def test_resubmissions_stop_at_the_bound(tmp_path):
    jobs = [FakeJob(["RUNNING", "TIMEOUT"], None, snapshot=k) for k in (10, 20, 30)]
    verdict, subs, fake, *_ = run(tmp_path, jobs, max_resubmits=1)
    assert verdict.outcome == "failed" and "after 1 resubmissions" in verdict.reason and submissions(fake) == 2

