"""The trainer's heartbeat (each rank's file of phase and iteration, written by a thread every few seconds) and the
collectives that give up: a Gloo all_reduce whose peer is stopped ends the run within the process group's timeout,
naming itself, in the rank's words and its heartbeat."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import ingest_digits, train_args

from firescale.jobs.heartbeat import read_beats
from firescale.train.heartbeat import Heartbeat, heartbeat_interval

SOLVER = """\
type: SGD
base_lr: 0.01
momentum: 0.9
lr_policy: fixed
max_iter: {max_iter}
test_interval: 20
display: 10
snapshot: 10
snapshot_prefix: snapshot
random_seed: 7
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("heartbeat"))
    (root / "short.yaml").write_text(SOLVER.format(max_iter=40))
    (root / "long.yaml").write_text(SOLVER.format(max_iter=100000))
    return root


def test_the_heartbeat_thread_writes_phases_and_iterations_and_ends_with_done(tmp_path):
    beat = Heartbeat(tmp_path, rank=1, size=2, interval_s=0.05).start()
    first = read_beats(tmp_path)[1]
    assert first.phase == "startup" and first.iteration == 0 and first.size == 2
    beat.enter("train")
    for it in range(1, 4):
        beat.updated(it)
    with beat.during("eval"):
        beat.step()
        time.sleep(0.2)
        during = read_beats(tmp_path)[1]
    time.sleep(0.2)
    after = read_beats(tmp_path)[1]
    beat.stop()
    last = read_beats(tmp_path)[1]
    assert (during.phase, during.iteration, during.steps) == ("eval", 3, 1)
    assert (after.phase, after.iteration, after.steps) == ("train", 3, 3)
    assert last.phase == "done" and last.beat > after.beat > during.beat > first.beat


def test_the_thread_beats_while_the_loop_waits(tmp_path):
    """A rank blocked in a collective keeps beating with the same numbers: alive, not progressing."""
    beat = Heartbeat(tmp_path, rank=0, size=1, interval_s=0.05).start()
    beat.enter("train")
    beat.updated(7)
    time.sleep(0.1)
    a = read_beats(tmp_path)[0]
    time.sleep(0.3)       # the loop "waits": it changes nothing
    b = read_beats(tmp_path)[0]
    beat.stop()
    assert b.beat > a.beat and b.progress == a.progress == ("train", 7, 1)


def test_no_heartbeat_with_interval_zero_and_a_bad_interval_is_one_sentence(tmp_path):
    beat = Heartbeat(tmp_path, rank=0, size=1, interval_s=0).start()
    beat.updated(1)
    beat.stop()
    assert read_beats(tmp_path) == {}
    assert heartbeat_interval({"FIRESCALE_HEARTBEAT_SECONDS": "0.5"}) == 0.5
    from firescale.errors import FirescaleError
    with pytest.raises(FirescaleError, match="FIRESCALE_HEARTBEAT_SECONDS is 'soon'; it must be a number"):
        heartbeat_interval({"FIRESCALE_HEARTBEAT_SECONDS": "soon"})


def test_a_failure_is_the_last_heartbeat_with_its_words(tmp_path):
    from firescale.train.backend import CollectiveGaveUp

    beat = Heartbeat(tmp_path, rank=0, size=2, interval_s=0.05).start()
    beat.enter("train")
    beat.updated(12)
    beat.fail(CollectiveGaveUp("all_reduce (Gloo)", "the all_reduce ... gave up"))
    last = read_beats(tmp_path)[0]
    assert (last.phase, last.iteration, last.gave_up, last.error) == ("failed", 12, "all_reduce (Gloo)",
                                                                      "the all_reduce ... gave up")


@pytest.mark.pytorch
def test_a_training_run_leaves_its_heartbeat_done_at_the_last_iteration(work):
    env = {**os.environ, "FIRESCALE_HEARTBEAT_SECONDS": "0.2", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "firescale", *train_args(work, "one", "short.yaml", "--framework",
                                                                          "pytorch", "--batch-per-rank", "16")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    beats = read_beats(work / "one")
    assert list(beats) == [0] and beats[0].phase == "done" and beats[0].iteration == 40 and beats[0].interval_s == 0.2


def _wait_for(predicate, seconds: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the ranks ended before {what}:\n{out[-4000:]}")
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.1)


@pytest.mark.mpi
@pytest.mark.pytorch
@pytest.mark.slow
def test_a_gloo_all_reduce_with_a_stopped_peer_gives_up_within_the_timeout_naming_itself(work):
    """Rank 1 stopped (SIGSTOP) while training on Gloo: rank 0's all_reduce gives up after the process group's
    timeout (5 s here, the site's collective_timeout.seconds as the job exports it), the run ends naming the
    collective, and rank 0's last heartbeat says which collective gave up at which iteration."""
    from mpitools import mpirun_argv

    timeout_s = 5
    env = {"FIRESCALE_HEARTBEAT_SECONDS": "0.2", "FIRESCALE_COLLECTIVE_TIMEOUT_S": str(timeout_s),
           "PYTHONUNBUFFERED": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    out = work / "gloo"
    argv = [sys.executable, "-m", "firescale", *train_args(work, "gloo", "long.yaml", "--framework", "pytorch",
                                                           "--process-group", "gloo", "--batch-per-rank", "16")]
    proc = subprocess.Popen(mpirun_argv(2, argv, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})
    stopped = None
    try:
        _wait_for(lambda: all(b.phase == "train" and b.iteration >= 5 for b in read_beats(out).values())
                  and len(read_beats(out)) == 2, 240, "two training ranks", proc)
        stopped = read_beats(out)[1].pid
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if stopped is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(stopped, sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, output[-3000:]
    # within the timeout, and what it takes mpirun to end the ranks after rank 0's error
    assert timeout_s - 1 <= took <= timeout_s + 30, (took, output[-3000:])
    assert "firescale: error: the all_reduce of rank 0 over 2 ranks (Gloo) gave up:" in output, output[-3000:]
    assert "the site's collective_timeout.seconds" in output
    last = read_beats(out)[0]
    assert last.phase == "failed" and last.gave_up == "all_reduce (Gloo)" and last.iteration >= 5
    assert json.loads((out / "heartbeat" / "rank-00000.json").read_text())["error"].startswith("the all_reduce")


@pytest.mark.pytorch
@pytest.mark.parametrize("sent", [signal.SIGUSR2, signal.SIGUSR1])
def test_the_trainer_snapshots_and_stops_on_either_walltime_signal(work, sent):
    """USR2, the walltime signal where NCCL runs, stops a run as USR1 does: a snapshot, exit 143; the heartbeat
    ends done at the snapshot's iteration."""
    out = work / f"signal-{sent.name}"
    env = {**os.environ, "FIRESCALE_HEARTBEAT_SECONDS": "0.2", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "firescale", *train_args(work, out.name, "long.yaml", "--framework",
                                                                            "pytorch", "--batch-per-rank", "16")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_for(lambda: (b := read_beats(out).get(0)) is not None and b.phase == "train" and b.iteration >= 5,
                  240, "a training rank", proc)
        proc.send_signal(sent)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, output[-3000:]
    assert f"stopped by {sent.name} at iteration" in output
    last = read_beats(out)[0]
    assert last.phase == "done" and (out / "snapshots" / f"snapshot_iter_{last.iteration}.solverstate").exists()


# Rank 1 stays alive but never joins the second allreduce (a rank that took another path); rank 0 asks the
# TensorFlow backend what the error it gets means.
SKIPPING_RANK = """\
import sys, time
import tensorflow as tf
import horovod.tensorflow as hvd
from firescale.train.tensorflow.backend import TensorFlowBackend
hvd.init()
x = tf.ones([1024])
hvd.allreduce(x, name="warm")
if hvd.rank() == 1:
    time.sleep(60)
    sys.exit(0)
t0 = time.time()
try:
    hvd.allreduce(x, name="grads")
except Exception as exc:
    print(f"after {time.time() - t0:.1f} s: {TensorFlowBackend('fp32').gave_up(exc)}", flush=True)
    sys.exit(1)
"""


@pytest.mark.mpi
@pytest.mark.tensorflow
@pytest.mark.slow
def test_horovods_stall_shutdown_ends_a_collective_a_rank_never_joins_naming_it(tmp_path):
    """With the site's collective_timeout keys as the job exports them (check 2 s, shutdown 6 s here), Horovod names
    the rank missing from an allreduce and shuts down; the backend reads the error as Horovod's allreduce giving
    up.  (A rank that is stopped outright blocks Horovod's own negotiation, so its check never runs: measured, no
    message in 60 s; there the runner's stall watch ends the job.)"""
    from mpitools import mpirun_argv

    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "6",
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    script = tmp_path / "skip.py"
    script.write_text(SKIPPING_RANK)
    proc = subprocess.run(mpirun_argv(2, [sys.executable, str(script)], env), capture_output=True, text=True,
                          timeout=180, env={**os.environ, **env})
    out = proc.stdout + proc.stderr
    assert "Missing ranks:" in out and "is stalled for longer than 6 seconds. Will shutdown." in out, out[-3000:]
    line = next(l for l in out.splitlines() if l.startswith("after "))
    took = float(line.split()[1])
    assert 6 <= took <= 30, line
    assert "Horovod's allreduce gave up: Horovod has been shut down." in line, line


def test_the_heartbeat_waits_for_the_run_folder_and_never_makes_it(tmp_path):
    run = tmp_path / "run"
    beat = Heartbeat(run, rank=0, size=1, interval_s=0.05).start()
    time.sleep(0.2)
    assert not run.exists()              # a refused start leaves nothing behind
    run.mkdir()
    beat.enter("train")
    beat.updated(3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and read_beats(run).get(0) is None:
        time.sleep(0.02)
    assert read_beats(run)[0].iteration == 3
    beat.stop()
    assert read_beats(run)[0].phase == "done"
