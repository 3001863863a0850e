"""Stalls against the fake Slurm: ranks whose heartbeats (written here as the trainer's thread writes them) stop
beating or stop progressing, on the runner's clock; what is cancelled, what is left alone, what is resubmitted."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fake_scheduler import FakeJob, FakeScheduler

from firescale.data.batch import READ_MAX
from firescale.jobs.heartbeat import RankBeat, read_beats, write_beat
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.schedulers.base import STALLED
from firescale.jobs.stall import STALL_FLOOR_S, StallWatch, default_stall_after
from firescale.sweep.records import PointRecord
from firescale.sweep.run import PointRun, Polling, collect, stall_watch

OK = {"exit_code": 0, "signal": "", "start": "2026-01-01T00:01:00Z", "end": "2026-01-01T00:05:00Z"}
DONE = {"status": "finished"}
RUNNING_FOR = lambda polls: ["RUNNING"] * polls  # noqa: E731


class Ranks:
    """Two ranks of the job the fake scheduler runs now, beating once a second of the fake clock: `script(t)`
    gives, at the job's second t, each rank's (phase, iteration), or None for a rank that no longer writes."""

    def __init__(self, run_dir: Path, fake: FakeScheduler, scripts: list[Callable[[float], list]]) -> None:
        self.run_dir, self.fake, self.scripts = run_dir, fake, scripts
        self.now = 0.0
        self.started: dict[str, float] = {}
        self.beats = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if not self.fake.jobs:
            return
        job_id = max(self.fake.jobs)
        job = self.fake.jobs[job_id]
        if job.cancelled or job.polls >= len(job.states):
            return
        t = self.now - self.started.setdefault(job_id, self.now)
        self.beats += 1
        for rank, now in enumerate(self.scripts[len(self.started) - 1](t)):
            if now is not None:
                phase, iteration = now
                write_beat(self.run_dir, RankBeat(rank=rank, size=2, host=f"n{rank + 1}", pid=100 + rank,
                                                  job_id=job_id, phase=phase, iteration=iteration, steps=iteration,
                                                  beat=self.beats, time=self.now, phase_time=0.0, interval_s=1.0))


def _point_run(tmp_path, jobs, scripts, stall_after=10.0, max_resubmits=2):
    run_dir = tmp_path / "run"
    fake = FakeScheduler(run_dir=run_dir, script=list(jobs))
    ranks = Ranks(run_dir, fake, scripts)
    lines: list[str] = []
    point = PointRun(scheduler=get_scheduler("slurm", fake), script=tmp_path / "job.sh", run_dir=run_dir,
                     max_resubmits=max_resubmits, log=lines.append, sleep=ranks.sleep,
                     polling=Polling(first=1, factor=1, most=1, status_wait=2),
                     stall=StallWatch(run_dir, stall_after, clock=ranks.clock))
    return point, fake, ranks, lines


def _snapshot(run_dir: Path, iteration: int) -> None:
    (run_dir / "snapshots").mkdir(parents=True, exist_ok=True)
    (run_dir / "snapshots" / f"snapshot_iter_{iteration}.npz").write_bytes(b"")


def rank_1_stops_at_20(run_dir: Path) -> Callable[[float], list]:
    """Both ranks train an iteration a second; at 10 rank 0 snapshots; from 20 on rank 1 is stopped (SIGSTOP:
    no more writes) and rank 0 waits in the allreduce of iteration 21, beating."""
    def script(t: float) -> list:
        if t == 10:
            _snapshot(run_dir, 10)
        it = int(min(t, 20))
        return [("train", it), ("train", it) if t <= 20 else None]
    return script


def trains(t: float) -> list:
    return [("train", int(t)), ("train", int(t))]


def test_a_stopped_rank_is_found_within_stall_after_and_a_poll_cancelled_and_resubmitted(tmp_path):
    run_dir = tmp_path / "run"
    first = FakeJob(RUNNING_FOR(500))
    second = FakeJob(RUNNING_FOR(5) + ["COMPLETED"], OK, DONE, snapshot=60)
    point, fake, ranks, lines = _point_run(tmp_path, [first, second], [rank_1_stops_at_20(run_dir), trains])
    verdict, subs = point.run()
    text = "\n".join(lines)
    assert verdict.outcome == "succeeded", text
    assert fake.cancelled == ["1000"] and len(subs) == 2
    stalled = subs[0]
    assert stalled.state == STALLED and subs[1].state == "COMPLETED"
    stall = stalled.stall
    assert stall is not None and stall["last_iteration"] == 20
    assert [r["rank"] for r in stall["stopped"]] == [1] and stall["stopped"][0]["host"] == "n2"
    assert [r["rank"] for r in stall["waiting"]] == [0]
    # rank 1's last write came 20 s into the job: found once stall_after (10 s) passed without it, within a poll more
    assert 10 < stall["stopped"][0]["silent_s"] <= 10 + 1
    assert "job 1000: STALLED: no progress for" in text and "rank 1 on n2 stopped beating" in text, text
    assert "resubmitting from the snapshot at iteration 10: STALLED" in text, text
    # the record keeps the stall
    record = collect(PointRecord(site="s", experiment="e", point="g2-b64-r0", gpus=2, nodes=1, batch=64, lr=0.1,
                                 repeat=0, baseline=False, walltime="01:00:00", run_dir=str(run_dir),
                                 max_resubmits=2), verdict, subs, run_dir, tmp_path / "out" / "result.json",
                     tmp_path / "out" / "status.json")
    assert record["submissions"][0]["state"] == "STALLED"
    assert record["submissions"][0]["stall"]["stopped"][0]["where"] == "rank 1 on n2"


@pytest.mark.parametrize("per_read,expected_s", [(1, 10.0), (8, 10.0), (32, 38.4)])
def test_a_job_ten_times_slower_than_predicted_that_progresses_is_left_alone(tmp_path, per_read, expected_s):
    # predicted 0.1 s an iteration: stall_after from the prediction is 100 iterations or 12 reads' worth,
    # whichever is more (10 s, or 38.4 s when a read takes 32 batches; floor 2 s here)
    prediction = {"iteration_s": 0.1, "evaluation_s": 0.0, "evaluations": 0, "batches_per_read": per_read}
    after = default_stall_after(prediction, floor_s=2.0)
    assert after == pytest.approx(expected_s)
    # 1 s an iteration, `per_read` batches read at a time: `per_read` updates at once every `per_read` s
    slow = lambda t: [("train", per_read * int(t // per_read))] * 2  # noqa: E731
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(120) + ["COMPLETED"], OK, DONE)], [slow],
                                           stall_after=after)
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded" and fake.cancelled == [] and subs[0].stall is None, "\n".join(lines)
    assert max(b.iteration for b in read_beats(tmp_path / "run").values()) >= 20


def test_a_job_that_stops_between_its_reads_bursts_is_stalled_after_twelve_reads(tmp_path):
    # the same slow job reading 32 at a time, but after its first burst nothing moves: stalled, once 12 reads'
    # worth of predicted iterations (38.4 s) pass without progress, and resubmitted
    prediction = {"iteration_s": 0.1, "evaluation_s": 0.0, "evaluations": 0, "batches_per_read": 32}
    stuck = lambda t: [("train", 32 if t >= 32 else 0)] * 2  # noqa: E731
    first, second = FakeJob(RUNNING_FOR(500)), FakeJob(RUNNING_FOR(5) + ["COMPLETED"], OK, DONE)
    point, fake, ranks, lines = _point_run(tmp_path, [first, second], [stuck, trains],
                                           stall_after=default_stall_after(prediction, floor_s=2.0))
    verdict, subs = point.run()
    text = "\n".join(lines)
    assert verdict.outcome == "succeeded" and fake.cancelled == ["1000"], text
    assert subs[0].state == STALLED and subs[0].stall is not None and subs[0].stall["last_iteration"] == 32, text
    assert "no progress for 38" in text or "no progress for 39" in text, text


@pytest.mark.parametrize("phase", ["startup", "dataset-check", "snapshot"])
def test_a_long_phase_that_must_not_progress_is_no_stall_while_its_ranks_beat(tmp_path, phase):
    long_phase = lambda t: [(phase, 0), (phase, 0)] if t < 60 else trains(t)  # noqa: E731
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(80) + ["COMPLETED"], OK, DONE)], [long_phase])
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded" and fake.cancelled == [], "\n".join(lines)


def test_an_evaluation_progresses_by_its_test_batches(tmp_path):
    # 40 s of evaluation at iteration 20, a test batch a second: progress all along
    evaluating = lambda t: [("eval", 20), ("eval", 20)] if 20 <= t < 60 else trains(t)  # noqa: E731
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(80) + ["COMPLETED"], OK, DONE)],
                                           [lambda t: [(p, i + int(t)) for p, i in evaluating(t)]])
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded" and fake.cancelled == [], "\n".join(lines)


def test_a_silent_rank_is_no_stall_while_another_progresses(tmp_path):
    """Rank 1's heartbeat stops (its writes hang on a mount, say) while rank 0's iterations go on: the job
    progresses, so it is left alone."""
    quiet = lambda t: [("train", int(t)), ("train", 5) if t <= 5 else None]  # noqa: E731
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(60) + ["COMPLETED"], OK, DONE)], [quiet])
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded" and fake.cancelled == [], "\n".join(lines)


def test_ranks_alive_in_train_without_progress_stall(tmp_path):
    run_dir = tmp_path / "run"

    def hung(t: float) -> list:   # a collective that never completes: both ranks beat at iteration 15
        if t == 10:
            _snapshot(run_dir, 10)
        return [("train", int(min(t, 15))), ("train", int(min(t, 15)))]

    second = FakeJob(RUNNING_FOR(3) + ["COMPLETED"], OK, DONE, snapshot=30)
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(500)), second], [hung, trains])
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded" and subs[0].state == STALLED, "\n".join(lines)
    assert subs[0].stall["stopped"] == [] and len(subs[0].stall["waiting"]) == 2
    assert "every rank alive, none progressing" in "\n".join(lines)


def test_a_stalled_job_that_the_scheduler_ends_for_a_failed_node_fails_as_the_scheduler_says(tmp_path):
    run_dir = tmp_path / "run"
    lost = FakeJob(RUNNING_FOR(500), cancelled_state="NODE_FAIL")
    point, fake, ranks, lines = _point_run(tmp_path, [lost], [rank_1_stops_at_20(run_dir)])
    verdict, subs = point.run()
    assert verdict.outcome == "failed" and len(subs) == 1 and fake.cancelled == ["1000"], "\n".join(lines)
    assert verdict.reason.startswith("a node of the job failed (scheduler state NODE_FAIL)")
    assert "the job had stalled (no progress for" in verdict.reason and "rank 1 on n2" in verdict.reason
    assert subs[0].state == "NODE_FAIL" and subs[0].stall["stopped"][0]["rank"] == 1


def test_a_job_that_stalls_twice_at_the_same_iteration_without_a_newer_snapshot_fails(tmp_path):
    run_dir = tmp_path / "run"
    _snapshot(run_dir, 10)
    same = lambda t: [("train", int(min(10 + t, 15)))] * 2  # noqa: E731   resumed at 10, hangs at 15 each time
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(500)), FakeJob(RUNNING_FOR(500))],
                                           [same, same], max_resubmits=3)
    verdict, subs = point.run()
    assert verdict.outcome == "failed" and len(subs) == 2, "\n".join(lines)
    assert "attempts 0 and 1 both stalled at iteration 15 with no newer snapshot" in verdict.reason


def test_a_stall_before_the_first_snapshot_resubmits_from_the_start(tmp_path):
    early = lambda t: [("train", int(min(t, 5))), ("train", int(min(t, 5))) if t <= 5 else None]  # noqa: E731
    second = FakeJob(RUNNING_FOR(3) + ["COMPLETED"], OK, DONE, snapshot=30)
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(500)), second], [early, trains])
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded", "\n".join(lines)
    assert any("resubmitting from the start (no snapshot yet): STALLED" in line for line in lines)


def test_a_collective_that_gave_up_is_a_stall_resubmitted(tmp_path):
    run_dir = tmp_path / "run"

    def gives_up(t: float) -> list:
        if t == 10:
            _snapshot(run_dir, 10)
        if t >= 12:
            write_beat(run_dir, RankBeat(rank=0, size=2, host="n1", pid=100, job_id="1000", phase="failed",
                                         iteration=12, steps=12, beat=99, time=t, phase_time=0.0, interval_s=1.0,
                                         error="the all_reduce of rank 0 over 2 ranks (Gloo) gave up: Timed out",
                                         gave_up="all_reduce (Gloo)"))
            return [None, None]
        return trains(t)

    failed = FakeJob(RUNNING_FOR(14) + ["FAILED"], {**OK, "exit_code": 1}, None)
    second = FakeJob(RUNNING_FOR(3) + ["COMPLETED"], OK, DONE, snapshot=30)
    point, fake, ranks, lines = _point_run(tmp_path, [failed, second], [gives_up, trains], stall_after=100)
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded", "\n".join(lines)
    assert subs[0].state == STALLED and subs[0].stall["scheduler_state"] == "FAILED"
    assert "STALLED: rank 0 on n1 at iteration 12: the all_reduce of rank 0 over 2 ranks (Gloo) gave up" in \
        "\n".join(lines)


def test_no_heartbeat_is_no_stall(tmp_path):
    point, fake, ranks, lines = _point_run(tmp_path, [FakeJob(RUNNING_FOR(60) + ["COMPLETED"], OK, DONE)],
                                           [lambda t: [None, None]])
    verdict, subs = point.run()
    assert verdict.outcome == "succeeded" and fake.cancelled == []


def test_the_watch_polls_at_least_every_half_stall_after(tmp_path):
    point, *_ = _point_run(tmp_path, [], [trains], stall_after=30)
    point.polling = Polling(first=10, factor=1.5, most=120)
    assert point._polling().most == 15
    point.stall = None
    assert point._polling().most == 120


def test_stall_after_at_least_three_heartbeat_intervals(tmp_path):
    watch = StallWatch(tmp_path, 2.0, clock=lambda: 0.0)
    write_beat(tmp_path, RankBeat(rank=0, size=1, host="n1", pid=1, job_id="", phase="train", iteration=1, steps=1,
                                  beat=1, time=0.0, phase_time=0.0, interval_s=5.0))
    watch.look()
    assert watch.effective_after() == 15.0


@pytest.mark.parametrize("prediction,expected", [
    (None, STALL_FLOOR_S),
    ({"iteration_s": 0.01, "evaluation_s": 1.0, "evaluations": 10, "batches_per_read": 32}, STALL_FLOOR_S),
    ({"iteration_s": 6.0, "evaluation_s": 100.0, "evaluations": 2, "batches_per_read": 1}, 600.0),
    ({"iteration_s": 1.0, "evaluation_s": 1000.0, "evaluations": 4, "batches_per_read": 1}, 500.0),   # 2 x 250 s
    ({"iteration_s": 1.0, "evaluation_s": 50.0, "batches_per_read": 4}, STALL_FLOOR_S),   # 100 iterations
    ({"iteration_s": 1.0, "evaluation_s": 50.0, "batches_per_read": 16}, 192.0),          # 12 reads of 16
    # an older predict.json: no count, no evaluations, reads as large as the trainer's largest
    ({"iteration_s": 1.0, "evaluation_s": 50.0}, 12.0 * READ_MAX),
])
def test_the_default_stall_after_from_a_prediction(prediction, expected):
    assert default_stall_after(prediction) == expected


def test_sweep_runs_stall_after_the_points_own_the_prediction_or_the_floor(tmp_path):
    import json

    from firescale.cluster.site import load_site

    site = load_site("local")
    point = PointRecord(site="local", experiment="e", point="g2-b64-r0", gpus=2, nodes=1, batch=64, lr=0.1, repeat=0,
                        baseline=False, walltime="01:00:00", run_dir=str(tmp_path), max_resubmits=2)
    prediction = tmp_path / "predict.json"
    prediction.write_text(json.dumps({"points": {"g2-b64-r0": {"iteration_s": 2.0, "evaluations": 0,
                                                                 "batches_per_read": 1}}}))
    watch, words = stall_watch(point, site, prediction)
    assert watch is not None and watch.stall_after == 200.0 and "from the prediction" in words
    watch, words = stall_watch(point, site, None)
    assert watch is not None and watch.stall_after == site.stall_after_floor == STALL_FLOOR_S
    point.stall_after = 0
    assert stall_watch(point, site, prediction)[0] is None
    point.stall_after = 7
    assert stall_watch(point, site, prediction)[0].stall_after == 7
