"""`firescale train` as real MPI ranks on digits: N x b == 1 x N*b, bit-for-bit repeats, exact resume, 95%."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, train_args, weights

pytestmark = [pytest.mark.mpi]

SOLVER = """\
type: SGD
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: inv
gamma: 0.0001
power: 0.75
max_iter: {max_iter}
test_interval: {test_interval}
display: 10
snapshot: {snapshot}
snapshot_prefix: snapshot
test_initialization: false
random_seed: 7
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("train"))
    (root / "short.yaml").write_text(SOLVER.format(max_iter=100, test_interval=50, snapshot=5))
    (root / "long.yaml").write_text(SOLVER.format(max_iter=600, test_interval=25, snapshot=0))
    return root


ENV = {"OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.fixture(scope="module")
def two_rank_run(work) -> Path:
    """An uninterrupted 2-rank run (2 x 16) of 100 iterations, snapshots every 5."""
    from mpitools import mpirun_argv

    argv = [sys.executable, "-m", "firescale", *train_args(work, "a", "short.yaml", "--batch-per-rank", "16")]
    proc = subprocess.run(mpirun_argv(2, argv, ENV), capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work / "a"


@pytest.mark.tensorflow
@pytest.mark.slow
def test_two_ranks_equal_one_rank_with_twice_the_batch(work, run_ranks, two_rank_run):
    run_ranks(1, train_args(work, "one", "short.yaml", "--batch-per-rank", "32", "--set", "max_iter=10"),
              timeout=300)
    for k in (5, 10):
        two = weights(two_rank_run / "snapshots" / f"snapshot_iter_{k}.solverstate")
        one = weights(work / "one" / "snapshots" / f"snapshot_iter_{k}.solverstate")
        start = weights(two_rank_run / "snapshots" / "snapshot_iter_5.solverstate")
        for name in (n for n in two if n.startswith("weights/")):
            scale = np.abs(one[name]).max()
            assert np.abs(two[name] - one[name]).max() / scale < 1e-5, (k, name)
        if k == 10:
            assert any(not np.array_equal(two[n], start[n]) for n in two)  # it trained between 5 and 10
    result = json.loads((two_rank_run / "result.json").read_text())
    assert result["ranks"] == 2 and result["batch"]["total_batch"] == 32 and result["iterations"] == 100
    assert result["status"] == "finished" and result["allreduce"]["controller"] in ("mpi", "gloo")
    allreduce = result["allreduce"]
    if allreduce["cpu_operations"] == "mpi":    # no setting: Open MPI's fixed rules, resolved for the gradient
        from firescale.model.layers import net_cost
        from firescale.nets.zoo import get_net

        gradient = net_cost(get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1)), 1).weight_bytes
        assert allreduce["library"] == "openmpi" and allreduce["message_bytes"] == gradient > 262144
        assert allreduce["model"] == "rabenseifner" and "Open MPI's fixed rules" in allreduce["algorithm"]
        assert allreduce["collectives"] == {"library": "MPI", "gpu_operations": None, "mpi_enabled": True,
                                            "gloo_enabled": False, "nccl_built": False}
    assert len(result["evals"]) == 2 and result["evals"][-1]["iter"] == 100
    # each evaluation's own time, which add up to the run's evaluation time
    assert all(e["seconds"] > 0 for e in result["evals"])
    assert sum(e["seconds"] for e in result["evals"]) == pytest.approx(result["segments"][0]["eval_s"])
    assert result["per_iteration"]["iterations"] == 100 and result["images_per_s"] > 0
    # iterations 0 and 50 ran in parts, timing compute and allreduce apart; the others as one graph
    assert result["per_iteration"]["split_iterations"] == 2 and result["per_iteration"]["split_every"] == 50
    assert result["per_iteration"]["allreduce_s"] > 0 and result["per_iteration"]["compute_s"] > 0


@pytest.mark.tensorflow
@pytest.mark.slow
def test_same_seed_and_ranks_reproduce_bit_for_bit_whole_or_in_parts(work, run_ranks, two_rank_run):
    # every iteration in parts (gradients, allreduce, update as three calls) against mostly one graph each
    run_ranks(2, train_args(work, "b", "short.yaml", "--batch-per-rank", "16", "--set", "snapshot=0",
                            "--split-every", "1"), timeout=300)
    a = weights(two_rank_run / "snapshots" / "snapshot_iter_100.solverstate")
    b = weights(work / "b" / "snapshots" / "snapshot_iter_100.solverstate")
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    split = json.loads((work / "b" / "result.json").read_text())["per_iteration"]
    assert split["split_iterations"] == split["iterations"] == 100 and split["split_every"] == 1


def _rank_pids(mpirun_pid: int) -> list[int]:
    import psutil

    kids = psutil.Process(mpirun_pid).children(recursive=True)
    return [p.pid for p in kids if "firescale" in " ".join(p.cmdline())]


@pytest.mark.tensorflow
@pytest.mark.slow
def test_sigterm_then_resume_gives_the_uninterrupted_weights(work, run_ranks, two_rank_run):
    from mpitools import mpirun_argv

    out = work / "c"
    args = train_args(work, "c", "short.yaml", "--batch-per-rank", "16", "--set", "snapshot=0")
    argv = [sys.executable, "-m", "firescale", *args]
    proc = subprocess.Popen(mpirun_argv(2, argv, ENV), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **ENV})
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("iter 20/"):
            pids = _rank_pids(proc.pid)
            assert len(pids) == 2
            os.kill(pids[-1], signal.SIGTERM)  # one rank only: the ranks must agree to stop together
            break
    rest = proc.communicate(timeout=120)[0]
    text = "".join(seen) + rest
    assert proc.returncode != 0, text
    assert "stopped by" in text, text
    result = json.loads((out / "result.json").read_text())
    stopped_at = result["iterations"]
    assert result["status"] == "interrupted" and 20 <= stopped_at < 100, text
    assert (out / "snapshots" / f"snapshot_iter_{stopped_at}.firescale.json").exists()

    run_ranks(2, [*args, "--resume"], timeout=300)
    resumed = json.loads((out / "result.json").read_text())
    assert resumed["status"] == "finished" and resumed["iterations"] == 100
    assert [s["start_iter"] for s in resumed["segments"]] == [0, stopped_at]
    assert resumed["train_time_s"] == pytest.approx(sum(s["train_s"] for s in resumed["segments"]))
    a = weights(two_rank_run / "snapshots" / "snapshot_iter_100.solverstate")
    c = weights(out / "snapshots" / "snapshot_iter_100.solverstate")
    for name in a:
        assert np.array_equal(a[name], c[name]), name
    log = (out / "mllog.txt").read_text()
    assert log.count('"key": "run_start"') == 2 and '"key": "eval_accuracy"' in log


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_chosen_caffe_snapshot_resumes_bit_for_bit_and_writes_hdf5(work, run_ranks, two_rank_run):
    """--snapshot names one of the uninterrupted run's Caffe snapshots (iteration 90, .caffemodel +
    .solverstate); the resumed run writes HDF5 snapshots, as `snapshot_format: HDF5` asks, and ends with the
    uninterrupted run's weights and history blobs, bit for bit."""
    chosen = two_rank_run / "snapshots" / "snapshot_iter_90.solverstate"
    proc = run_ranks(2, train_args(work, "e", "short.yaml", "--batch-per-rank", "16", "--snapshot", str(chosen),
                                   "--set", "snapshot_format=HDF5", "--set", "snapshot=5"), timeout=300)
    assert f"resuming from {chosen} at iteration 90" in proc.stdout
    out = work / "e" / "snapshots"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"snapshot_iter_{k}{suffix}" for k in (95, 100)
        for suffix in (".caffemodel.h5", ".solverstate.h5", ".firescale.json"))
    a = weights(two_rank_run / "snapshots" / "snapshot_iter_100.solverstate")
    e = weights(out / "snapshot_iter_100.solverstate.h5")
    assert a.keys() == e.keys() and len(a) == 16   # LeNet's 8 blobs and SGD's 8 history blobs
    for name in a:
        assert a[name].tobytes() == e[name].tobytes(), name
    resumed = json.loads((work / "e" / "result.json").read_text())
    assert [s["start_iter"] for s in resumed["segments"]] == [0, 90] and resumed["iterations"] == 100


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_run_stopped_by_the_update_that_made_an_evaluation_due_takes_it_when_resumed(work, run_ranks,
                                                                                        two_rank_run):
    """The uninterrupted run's snapshot at iteration 50 was written before that iteration's evaluation, as a
    walltime stop on an evaluation's iteration (max_iter's too) leaves it: resumed there, the run takes the
    evaluation it missed before it steps on, and its evaluations are the uninterrupted run's."""
    chosen = two_rank_run / "snapshots" / "snapshot_iter_50.solverstate"
    run_ranks(2, train_args(work, "f", "short.yaml", "--batch-per-rank", "16", "--snapshot", str(chosen)),
             timeout=300)
    uninterrupted = json.loads((two_rank_run / "result.json").read_text())["evals"]
    resumed = json.loads((work / "f" / "result.json").read_text())["evals"]
    assert [e["iter"] for e in resumed] == [e["iter"] for e in uninterrupted] == [50, 100], resumed
    for ours, theirs in zip(resumed, uninterrupted):
        assert (ours["top1"], ours["top5"], ours["loss"]) == (theirs["top1"], theirs["top5"], theirs["loss"])


@pytest.mark.tensorflow
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_digits_reaches_95_percent(work, run_ranks, ranks):
    out = work / f"acc{ranks}"
    tree = {"FIRESCALE_ALLREDUCE": "tree", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
            "OMPI_MCA_coll_tuned_allreduce_algorithm": "2", "OMPI_MCA_coll_tuned_reduce_algorithm": "5",
            "OMPI_MCA_coll_tuned_bcast_algorithm": "6", "HOROVOD_CPU_OPERATIONS": "MPI"}
    proc = run_ranks(ranks, train_args(work, f"acc{ranks}", "long.yaml", "--total-batch", "64",
                                       "--target", "0.95", "--profile-layers"),
                     env=tree if ranks == 2 else None, timeout=300)
    result = json.loads((out / "result.json").read_text())
    if ranks == 2:
        assert result["allreduce"]["tree"] and "reduce binomial" in result["allreduce"]["algorithm"]
        assert result["allreduce"]["library"] == "openmpi" and result["allreduce"]["model"] == "tree"
    from firescale.model.traces import read_trace

    trace = read_trace(out / result["layer_trace"])
    assert [r.name for r in trace][:2] == ["data_wait", "conv1"] and trace[1].gradient_bytes == (25 * 20 + 20) * 4
    assert (trace[1].comm_us > 0) == (ranks == 2)
    assert result["reached_target"] and result["status"] == "target_reached", proc.stdout[-2000:]
    assert result["evals"][-1]["top1"] >= 0.95 and result["iterations"] < 600
    assert result["time_to_accuracy_s"] == result["evals"][-1]["wall_s"] > 0
    assert result["dataset_manifest_sha256"] and result["hostnames"] and result["versions"]["horovod"]
    assert "iter 10/600" in proc.stdout  # progress line every `display` iterations
    log = [json.loads(line.split(" ", 1)[1]) for line in (out / "mllog.txt").read_text().splitlines()
           if line.startswith(":::MLLOG")]
    keys = [entry["key"] for entry in log]
    assert keys.index("run_start") < keys.index("eval_accuracy") < keys.index("run_stop")
    assert log[-1]["metadata"]["status"] == "success"


def test_unknown_solver_key_is_an_error_naming_it(work):
    bad = work / "bad.yaml"
    bad.write_text("base_lr: 0.01\nmax_iter: 10\nlearning_rate_policy: step\n")
    proc = subprocess.run([sys.executable, "-m", "firescale", *train_args(work, "bad", "bad.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "unknown solver key 'learning_rate_policy'" in proc.stderr
