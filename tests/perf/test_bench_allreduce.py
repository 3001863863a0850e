"""`firescale bench allreduce` over real MPI ranks: checked sums and the models it prints beside them.

Timings on 2 shared cores (4 ranks oversubscribed) are the benchmark's to print, not a test's to
assert: the measured growth of the parameter server with p is in the closing notes and the README."""
from __future__ import annotations

import json
import sys

import pytest

from firescale.errors import FirescaleError


@pytest.mark.slow
def test_bench_allreduce_checks_every_algorithm_and_predicts_the_parameter_server_growing(run_ranks, tmp_path, repo):
    predicted = {}
    for p in (2, 4):
        out = tmp_path / f"ar{p}.json"
        proc = run_ranks(p, ["bench", "allreduce", "--sizes-mb", "8", "--reps", "3", "--algorithms",
                             "ps,tree,ring,mpi", "--bandwidth-gbits", "40", "--latency-us", "1",
                             "--json", str(out)], timeout=240, cwd=repo)
        assert "meas/pred" in proc.stdout
        data = json.loads(out.read_text())
        assert data["ranks"] == p
        # every algorithm's sum was checked on every rank inside the benchmark
        runs = {m["algorithm"]: m for m in data["measurements"]}
        assert set(runs) == {"ps", "tree", "ring", "mpi"}
        assert all(m["min_s"] > 0 and m["predicted_s"] > 0 for m in runs.values())
        predicted[p] = {a: m["predicted_s"] for a, m in runs.items()}
    # The root receives p-1 gradients and sends p-1: 3x the traffic at 4 ranks as at 2, while the
    # tree's depth grows from 1 to 2.
    assert predicted[4]["ps"] == pytest.approx(3 * predicted[2]["ps"], rel=0.05)
    assert predicted[4]["tree"] < predicted[4]["ps"]


@pytest.mark.tensorflow
def test_horovod_allreduce_sums_and_feeds_the_communication_fit(run_ranks, tmp_path, repo):
    """`horovod` is the trainer's own allreduce: its sum is checked like the others', and a calibration
    prefers it over the MPI algorithms when fitting the communication factor."""
    from firescale.predict.calibrate import allreduce_measurement

    out = tmp_path / "ar.json"
    run_ranks(2, ["bench", "allreduce", "--sizes-mb", "0.5,2", "--reps", "5", "--algorithms", "tree,horovod",
                  "--json", str(out)], timeout=240, cwd=repo)
    runs = json.loads(out.read_text())["measurements"]
    assert sorted((m["algorithm"], m["bytes"]) for m in runs) == [
        ("horovod", 500_000), ("horovod", 2_000_000), ("tree", 500_000), ("tree", 2_000_000)]
    assert all(m["min_s"] > 0 and m["ranks"] == 2 for m in runs)
    picked = allreduce_measurement(out, "tree", 524_320)        # LeNet on digits: the nearer size, Horovod's
    horovod_small = next(m for m in runs if m["algorithm"] == "horovod" and m["bytes"] == 500_000)
    assert picked["measured"] == "horovod" and picked["algorithm"] == "tree"
    assert picked["bytes"] == 500_000 and picked["seconds"] == horovod_small["median_s"]
    assert allreduce_measurement(out, "tree")["bytes"] == 2_000_000   # no size asked: the largest
    # After a synthetic step, as an iteration pays it: the step's time alone is recorded and subtracted.
    stepped = tmp_path / "stepped.json"
    run_ranks(2, ["bench", "allreduce", "--sizes-mb", "0.5", "--reps", "5", "--algorithms", "horovod",
                  "--compute-ms", "3", "--overlap-ms", "1", "--json", str(stepped)], timeout=240, cwd=repo)
    data = json.loads(stepped.read_text())
    (m,) = data["measurements"]
    assert data["compute_ms"] == 3 and 0.0015 < m["compute_s"] < 0.03   # sized to ~3 ms on this core
    # --overlap-ms: the same allreduce timed beside 1 ms of compute too (its sums checked as the others'), and
    # the share of it that compute hid, which the calibration takes
    assert len(m["overlapped_seconds"]) == 5 and 0 <= m["hidden_share"] <= 1
    assert 0.0005 < m["window_s"] < m["compute_s"]     # a third of the step: apart even when cores are busy
    # Calibration takes the mean after the step as it was measured, whatever it came to: on cores busy with the
    # other worker the difference can come out below zero, and then calibration refuses it and says to measure
    # again (what a user does); otherwise it fits exactly the recorded figures.  Measured once, never rerun.
    after_step = m.get("mean_s", m["median_s"])
    print(f"the allreduce after the {m['compute_s'] * 1e3:.2f} ms step: {after_step * 1e3:.3f} ms (mean of 5)")
    if after_step < 0:
        with pytest.raises(FirescaleError, match=r"stepped\.json: the horovod allreduce over 2 ranks timed -[\d.]+ "
                                                 r"ms, below zero .*measure again"):
            allreduce_measurement(stepped, "tree", 524_320)
    else:
        picked = allreduce_measurement(stepped, "tree", 524_320)
        assert picked["seconds"] == after_step and picked["after_step_s"] == m["compute_s"]
        assert picked["hidden_share"] == m["hidden_share"] and picked["measured"] == "horovod"
    assert "hidden_share" not in allreduce_measurement(out, "tree", 524_320)
    only_mpi = tmp_path / "mpi.json"
    only_mpi.write_text(json.dumps({"measurements": [m for m in runs if m["algorithm"] == "tree"]}))
    assert allreduce_measurement(only_mpi, "tree", 524_320)["measured"] == "tree"
    with pytest.raises(FirescaleError, match="no 'horovod', 'torch' or 'ring' measurement"):
        allreduce_measurement(only_mpi, "ring")


@pytest.mark.tensorflow
def test_a_nets_gradients_are_summed_by_horovod_as_one_group_and_by_mpi_as_one_buffer(run_ranks, tmp_path, repo):
    """--gradients-of reduces the net's |W| as the trainer does: Horovod's grouped allreduce of one tensor per
    weight and bias blob (and the loss pair), every sum checked; MPI the same bytes as one buffer."""
    from firescale.model.layers import net_cost
    from firescale.nets.zoo import get_net

    out = tmp_path / "grads.json"
    proc = run_ranks(2, ["bench", "allreduce", "--gradients-of", "lenet_same", "--input", "28,28,1", "--classes", "10",
                         "--reps", "3", "--algorithms", "mpi,horovod", "--json", str(out)], timeout=240, cwd=repo)
    cost = net_cost(get_net("lenet_same", num_classes=10, input_shape=(28, 28, 1)), 1)
    data = json.loads(out.read_text())
    assert data["gradients_of"] == "lenet_same"
    by = {m["algorithm"]: m for m in data["measurements"]}
    assert by["horovod"]["bytes"] == by["mpi"]["bytes"] == cost.weight_bytes
    assert by["horovod"]["tensors"] == len(cost.gradient_tensors) == 8 and by["mpi"]["tensors"] == 0
    assert "Horovod sums lenet_same's 8 gradients and the loss as one group" in proc.stdout


PROBE_ITERATION = """
import json, pathlib, sys
import numpy as np
from mpi4py import MPI
from firescale.bench.allreduce_tensorflow import HorovodIteration, trainer_rank

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
tensors = (6, 4, 5)
send = np.full(sum(tensors), float(rank + 1), np.float32)
probe = HorovodIteration(trainer_rank(size), send, tensors, 0.002, batch=3, input_shape=(4, 4, 1), comm=comm)
state = lambda: {"weights": [w.numpy().tolist() for w in probe.net.params],
                 "history": [h.numpy().tolist() for h in probe.solver.history]}
seen = {"start": state()}
probe.with_allreduce()
seen["summed"], seen["loss_and_flag"] = state(), probe.loss_and_flag.numpy().tolist()
probe.without_allreduce()
seen["alone"] = state()
recv = np.empty_like(send)
probe.copy_result(recv)
seen["copied"], seen["ops"] = recv.tolist(), sorted({op.type for op in probe._with.graph.get_operations()})
seen["scopes"] = sorted({op.name.split("/")[0] for op in probe._with.graph.get_operations()})
pathlib.Path(sys.argv[1], f"rank-{rank}.json").write_text(json.dumps(seen))
"""


@pytest.mark.tensorflow
@pytest.mark.mpi
def test_the_probes_iteration_is_the_trainers_summing_over_the_ranks_and_updating_as_its_solver(run_ranks, tmp_path):
    """The probe's iteration is train/tensorflow/steps.py's `trace_iteration` around the rank's `Rank.sum`: on two
    ranks each tensor is summed over both with the loss pair, and Caffe's SGD (rate 1, effective batch 1, no
    momentum) puts that sum in its history and takes it off the weights; the twin without the allreduce updates
    by the rank's own gradients.  Each rank writes its own file."""
    run_ranks(2, [sys.executable, "-c", PROBE_ITERATION, str(tmp_path)], timeout=240)
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        start, summed, alone = seen["start"], seen["summed"], seen["alone"]
        assert [len(w) for w in start["weights"]] == [6, 4, 5]        # stand-in parameters shaped as the tensors
        own = float(rank + 1)
        # (the sizing's iterations, without the allreduce, already updated them by this rank's own gradients)
        assert start["history"] == [[own] * n for n in (6, 4, 5)]
        assert summed["history"] == [[3.0] * n for n in (6, 4, 5)]   # 1 + 2 over the ranks: Horovod's sum
        moved = [[a - b for a, b in zip(after, before)] for after, before in zip(summed["weights"], start["weights"])]
        assert moved == [[-3.0] * n for n in (6, 4, 5)]                # w -= rate * sum / effective batch
        assert seen["loss_and_flag"] == [6.0, 0.0]                     # 3 labels a rank, stop flags 0
        assert alone["history"] == [[own] * n for n in (6, 4, 5)]      # no sum: this rank's gradients
        moved = [[a - b for a, b in zip(after, before)] for after, before in zip(alone["weights"], summed["weights"])]
        assert moved == [[-own] * n for n in (6, 4, 5)]
        assert seen["copied"] == [3.0] * 15                            # the sum the probe checks, from the history
        assert "HorovodGroupedAllreduce" in seen["ops"] and "MatMul" in seen["ops"]
        assert "update" in seen["scopes"]                              # the trainer's apply_update, by its scope


def test_the_hidden_share_is_the_share_of_the_allreduce_that_ran_beside_the_compute():
    from firescale.bench.allreduce_record import AllreduceMeasurement

    def share(serial: float, beside: float, window: float) -> float | None:
        return AllreduceMeasurement("horovod", 2, 1000, [serial] * 3, 0.05, 8, overlapped_seconds=[beside] * 3,
                                    window_s=window).hidden_share

    assert share(0.010, 0.004, 0.020) == pytest.approx(0.6)     # 6 of a 10 ms allreduce ran beside the compute
    assert share(0.010, 0.008, 0.004) == pytest.approx(0.2)     # 2 of 10 beside a 4 ms window
    assert share(0.010, 0.012, 0.020) == 0.0                    # slower beside the compute: none ran beside it
    assert share(0.010, 0.004, 0.0) is None                     # no window timed
    plain = AllreduceMeasurement("horovod", 2, 1000, [0.01], 0.02, 8)
    assert plain.hidden_share is None and "overlapped_seconds" not in plain.to_dict()
    assert AllreduceMeasurement("horovod", 2, 1000, [0.01], 0.02, 8, overlapped_seconds=[0.004], window_s=0.02
                                ).to_dict()["hidden_share"] == pytest.approx(0.6)


@pytest.mark.tensorflow
def test_a_nets_gradient_tensors_are_the_trainers_parameters():
    """The element counts the probe groups are those of the parameters the trainer sums, blob for blob."""
    import numpy as np

    from firescale.model.layers import net_cost
    from firescale.nets.zoo import get_net
    from firescale.train.tensorflow.nets import build_net

    for spec in (get_net("lenet_same", num_classes=10, input_shape=(28, 28, 1)), get_net("nin")):
        params = build_net(spec, 1).params
        assert net_cost(spec, 1).gradient_tensors == tuple(int(np.prod(p.shape)) for p in params), spec.name


def test_a_librarys_own_choice_is_fitted_from_mpi_allreduce_itself(tmp_path):
    """A site left to its library (openmpi-default, ...) has no hand-written benchmark of that name: without
    Horovod's measurement, the fit takes MPI_Allreduce's (`mpi`), which ran the library's choice."""
    from firescale.predict.calibrate import allreduce_measurement

    path = tmp_path / "ar.json"
    runs = [{"algorithm": a, "ranks": 2, "bytes": 500_000, "median_s": s} for a, s in (("tree", 0.002), ("mpi", 0.001))]
    path.write_text(json.dumps({"measurements": runs}))
    picked = allreduce_measurement(path, "openmpi-default", 524_320)
    assert picked["measured"] == "mpi" and picked["seconds"] == 0.001 and picked["algorithm"] == "openmpi-default"
    path.write_text(json.dumps({"measurements": runs[:1]}))
    with pytest.raises(FirescaleError, match="no 'horovod', 'torch' or 'mpi' measurement"):
        allreduce_measurement(path, "nccl-default")


def test_the_pytorch_trainers_allreduce_is_fitted_before_mpis_and_horovods_before_it(tmp_path):
    """`bench allreduce --framework pytorch` times MPI_Allreduce beside torch.distributed's all_reduce: the fit
    takes the trainer's (torch), what a PyTorch run pays; a file with Horovod's too takes Horovod's."""
    from firescale.predict.calibrate import allreduce_measurement

    path = tmp_path / "ar.json"
    runs = [{"algorithm": a, "ranks": 2, "bytes": 524_320, "median_s": s}
            for a, s in (("mpi", 0.001), ("torch", 0.003), ("horovod", 0.005))]
    path.write_text(json.dumps({"measurements": runs[:2]}))
    picked = allreduce_measurement(path, "ring", 524_320)
    assert picked["measured"] == "torch" and picked["seconds"] == 0.003 and picked["algorithm"] == "ring"
    assert picked["after_step_s"] == 0.0
    path.write_text(json.dumps({"measurements": runs}))
    assert allreduce_measurement(path, "ring", 524_320)["measured"] == "horovod"


def test_an_allreduce_record_that_cannot_be_fitted_is_refused_naming_the_file(tmp_path):
    """A hand-written or damaged record says which measurement lacks what; a Horovod allreduce timed below
    zero after a step (its iterations shorter with it than without) is refused wherever it is fitted from."""
    from firescale.predict.calibrate import allreduce_measurement

    path = tmp_path / "ar.json"
    path.write_text(json.dumps([{"algorithm": "mpi"}]))
    with pytest.raises(FirescaleError, match=r"ar\.json: not a `firescale bench allreduce --json` record"):
        allreduce_measurement(path, "ring")
    path.write_text(json.dumps({"measurements": [{"algorithm": "mpi", "ranks": 2, "median_s": 0.001}]}))
    with pytest.raises(FirescaleError, match=r"ar\.json: measurements\[0\] has no 'bytes'"):
        allreduce_measurement(path, "ring")
    stepped = {"algorithm": "horovod", "ranks": 4, "bytes": 500_000, "median_s": -0.0002, "mean_s": -0.0003,
               "compute_s": 0.02}
    path.write_text(json.dumps({"measurements": [stepped]}))
    with pytest.raises(FirescaleError, match=r"ar\.json: the horovod allreduce over 4 ranks timed -0\.300 ms, "
                                             "below zero"):
        allreduce_measurement(path, "ring")
    path.write_text(json.dumps({"measurements": [{**stepped, "mean_s": 0.0004}]}))
    assert allreduce_measurement(path, "ring")["seconds"] == 0.0004


def test_bad_benchmark_options_are_refused(repo):
    import subprocess
    import sys

    for args, message in ((["--compute-ms", "-1"], "--compute-ms must be 0 or more"),
                          (["--overlap-ms", "5", "--algorithms", "horovod"],
                           "--overlap-ms times Horovod's allreduce beside compute: give --algorithms with horovod "
                           "and --compute-ms"),
                          (["--overlap-ms", "-1"], "--overlap-ms must be 0 or more"),
                          (["--algorithms", "ps,gossip"], "unknown gossip"),
                          (["--sweep", "--gradients-of", "lenet_same"],
                           "give one of --sweep, --sizes-mb and --gradients-of"),
                          (["--input", "28,28,1"], "--input and --classes describe the net of --gradients-of"),
                          (["--gradients-of", "resnet"], "unknown net 'resnet'")):
        proc = subprocess.run([sys.executable, "-m", "firescale", "bench", "allreduce", *args],
                              capture_output=True, text=True, cwd=repo, timeout=120)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    # every command's --input is read the same way, and a malformed one is named before anything runs
    for command in (["bench", "allreduce", "--gradients-of", "lenet_same"], ["predict", "layers", "lenet_same"],
                    ["predict", "calibrate", "--net", "lenet_same", "--batch", "64", "--iteration-s", "0.02"]):
        for bad in ("28x28", "28,28", "28,0,1"):
            proc = subprocess.run([sys.executable, "-m", "firescale", *command, "--input", bad],
                                  capture_output=True, text=True, cwd=repo, timeout=120)
            expected = f"expected the net's input as H,W,C (three positive integers), not {bad!r}"
            assert proc.returncode == 2 and expected in proc.stderr, (command, proc.stderr)


def test_the_ranks_agree_on_one_matmul_cost_for_the_synthetic_step():
    """Every rank computes the same step: the median of the ranks' estimates, none below the floor; an estimate
    of 0 or less (matmuls timed no slower than none, on a core busy with another rank) is left out."""
    from firescale.bench.allreduce_tensorflow import agreed_matmul_seconds
    assert agreed_matmul_seconds([1e-4, 2e-4, 9e-4], floor_s=1e-6) == 2e-4
    assert agreed_matmul_seconds([-3e-5, 1e-4, 3e-4], floor_s=1e-6) == pytest.approx(2e-4)
    assert agreed_matmul_seconds([1e-9, 2e-9], floor_s=4e-6) == 4e-6     # 175,000 matmuls for 17 ms: refused
    with pytest.raises(FirescaleError, match="could not be sized: on every one of 2 ranks its matmuls timed no "
                                             "slower than none"):
        agreed_matmul_seconds([0.0, -1e-5], floor_s=1e-6)


@pytest.mark.pytorch
@pytest.mark.mpi
def test_torch_s_allreduce_over_gloo_and_mpi_is_timed_beside_mpi_and_fitted_as_each_group_runs(run_ranks, tmp_path,
                                                                                                 repo):
    """`torch` is the PyTorch trainer's allreduce (Rank.sum), here over Gloo and over the MPI group in one run: its sum
    is checked like MPI's, it is timed by the same protocol and set beside MPI_Allreduce of the same bytes; with
    --gradients-of it sums the net's gradients and the loss pair as one group, as the trainer does, where MPI sums
    them as one buffer.  A calibration fitted from the record takes the group the runs use, priced as it runs:
    Gloo as its ring, the MPI group as the site's allreduce."""
    from firescale.model.layers import net_cost
    from firescale.nets.zoo import get_net
    from firescale.predict.calibrate import allreduce_measurement

    out = tmp_path / "torch.json"
    proc = run_ranks(2, ["bench", "allreduce", "--framework", "pytorch", "--gradients-of", "lenet_same", "--input",
                         "8,8,1", "--classes", "10", "--reps", "5", "--process-groups", "gloo,mpi", "--json",
                         str(out)], timeout=240, cwd=repo)
    data = json.loads(out.read_text())
    assert data["framework"] == "pytorch" and data["process_groups"] == ["gloo", "mpi"]
    runs = {(m["algorithm"], m.get("process_group")): m for m in data["measurements"]}
    assert set(runs) == {("mpi", None), ("torch", "gloo"), ("torch", "mpi")}   # --framework pytorch's algorithms
    cost = net_cost(get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1)), 1)
    mpi_run = runs["mpi", None]
    for group in ("gloo", "mpi"):
        torch_run = runs["torch", group]
        assert torch_run["bytes"] == mpi_run["bytes"] == cost.weight_bytes
        assert torch_run["tensors"] == len(cost.gradient_tensors) and mpi_run["tensors"] == 0
        assert torch_run["ranks"] == 2
        # sane timings: every repetition measured, none longer than a second for half a megabyte on one machine
        assert len(torch_run["seconds"]) == 5 and 0 < torch_run["min_s"] <= torch_run["median_s"] < 1.0
    pairs = {p["process_group"]: p for p in data["torch_vs_mpi"]}
    assert set(pairs) == {"gloo", "mpi"} and all(p["bytes"] == cost.weight_bytes for p in pairs.values())
    assert pairs["mpi"]["percent_of_mpi"] == pytest.approx(100 * mpi_run["median_s"] / runs["torch", "mpi"]["median_s"])
    assert data["horovod_vs_mpi"] == [] and "torch/gloo" in proc.stdout
    assert "torch.distributed % of MPI rate" in proc.stdout
    gloo = allreduce_measurement(out, "tree", cost.weight_bytes, "gloo")
    mpi = allreduce_measurement(out, "tree", cost.weight_bytes, "mpi")
    assert (gloo["measured"], gloo["process_group"], gloo["algorithm"]) == ("torch", "gloo", "ring")
    assert (mpi["measured"], mpi["process_group"], mpi["algorithm"]) == ("torch", "mpi", "tree")
    assert gloo["seconds"] == runs["torch", "gloo"]["median_s"] and mpi["seconds"] == runs["torch", "mpi"]["median_s"]
    with pytest.raises(FirescaleError, match="timed over the process groups gloo, mpi; name the one the runs use"):
        allreduce_measurement(out, "tree", cost.weight_bytes)


def test_a_calibration_refuses_torch_s_allreduce_over_another_group_than_the_runs(tmp_path):
    from firescale.predict.calibrate import allreduce_measurement

    path = tmp_path / "ar.json"
    runs = [{"algorithm": "mpi", "ranks": 2, "bytes": 1000, "median_s": 0.001},
            {"algorithm": "torch", "ranks": 2, "bytes": 1000, "median_s": 0.004, "process_group": "gloo"}]
    path.write_text(json.dumps({"measurements": runs}))
    with pytest.raises(FirescaleError) as e:
        allreduce_measurement(path, "tree", 1000, "mpi")
    assert str(e.value) == (f"{path}: torch's allreduce was timed over gloo, not over mpi, the process group the runs "
                            "use; time it with `firescale bench allreduce --framework pytorch --process-groups mpi`")
    assert allreduce_measurement(path, "tree", 1000)["algorithm"] == "ring"   # its only group: Gloo's, its ring


@pytest.mark.parametrize("framework, algorithms, message", [
    ("pytorch", "mpi,horovod", "--algorithms horovod is another framework's allreduce than --framework pytorch's "
                               "(torch); give --framework tensorflow"),
    ("tensorflow", "torch", "--algorithms torch is another framework's allreduce than --framework tensorflow's "
                            "(horovod); give --framework pytorch"),
    ("tensorflow", "ring,gloo", "--algorithms: unknown gloo"),
])
def test_a_framework_times_only_its_own_allreduce(framework, algorithms, message):
    from firescale.bench.allreduce_vs_model import bench_algorithms

    with pytest.raises(FirescaleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bench_algorithms(framework, algorithms)
    assert bench_algorithms("pytorch", None) == ["mpi", "torch"]
    assert bench_algorithms("tensorflow", None) == ["ps", "tree", "ring"]
