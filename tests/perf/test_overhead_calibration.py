"""The fixed per-iteration overhead (beyond Paleo): fitting it, and calibrating from collected run records."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from run_records import run_record, train_result

from cli import run_firescale
from firescale.errors import FirescaleError
from firescale.model.comm import Link
from firescale.model.layers import net_cost
from firescale.model.paleo import Device, Platform, firecaffe_platform, predict_point
from firescale.nets.zoo import get_net
from firescale.predict.calibrate import calibrate, fit_compute_and_overhead, load_calibration
from firescale.predict.measurements import read_measured_iteration, short_run_command
from firescale.train.options import recorded_options

DIGITS_LENET = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
DIGITS_LENET_BYTES = 4 * sum(net_cost(DIGITS_LENET, 1).gradient_tensors)    # float32 gradients
TRUTH = Platform("local", Device("cpu", 7.68e10, 1e10, ppp=0.35), Link(5e9, 5e-7, ppp=0.8), "tree", overhead_s=0.0025)
START = Platform("local", Device("cpu", 7.68e10, 1e10), Link(5e9, 5e-7), "tree")


def test_overhead_adds_to_every_iteration_and_defaults_to_paleo():
    plain = predict_point(replace(TRUTH, overhead_s=0.0), DIGITS_LENET, 2, 64)
    with_overhead = predict_point(TRUTH, DIGITS_LENET, 2, 64)
    assert with_overhead.iteration_s == pytest.approx(plain.iteration_s + 0.0025)
    assert with_overhead.overhead_s == 0.0025 and plain.overhead_s == 0.0
    # The FireCaffe/NiN platform keeps Paleo's model: no overhead term.
    assert firecaffe_platform().overhead_s == 0.0
    with pytest.raises(FirescaleError, match="overhead_s"):
        replace(TRUTH, overhead_s=-1e-3)


def test_two_batch_sizes_recover_the_factor_and_the_overhead():
    runs = [(b, predict_point(TRUTH, DIGITS_LENET, 1, b).iteration_s) for b in (64, 32, 16)]
    ppp, overhead, details = fit_compute_and_overhead(DIGITS_LENET, runs, START.device)
    assert ppp == pytest.approx(0.35, rel=1e-6)
    assert overhead == pytest.approx(0.0025, rel=1e-6)
    assert details["max_residual_percent"] < 1e-6
    cal = calibrate(START, DIGITS_LENET, *runs[0], more_runs=runs[1:])
    assert cal.compute_source["overhead_fitted"] is True
    # Communication is not in single-rank runs: the 2-rank prediction differs from the truth only there.
    two = predict_point(cal.apply(START), DIGITS_LENET, 2, 64)
    truth_two = predict_point(TRUTH, DIGITS_LENET, 2, 64)
    assert two.iteration_s - two.comm_s == pytest.approx(truth_two.iteration_s - truth_two.comm_s, rel=1e-6)
    # One batch size only: Paleo's single factor, no overhead.
    single = calibrate(START, DIGITS_LENET, *runs[0])
    assert single.overhead_s == 0.0 and single.compute_source["overhead_fitted"] is False


def test_fits_that_make_no_sense_are_refused_or_clamped():
    with pytest.raises(FirescaleError, match="two or more different batch sizes"):
        fit_compute_and_overhead(DIGITS_LENET, [(64, 0.010), (64, 0.011)], START.device)
    # Time growing faster than the compute: a negative intercept is set to 0 and said so.
    ideal = [(b, predict_point(replace(TRUTH, overhead_s=0.0), DIGITS_LENET, 1, b).iteration_s) for b in (64, 8)]
    skewed = [(ideal[0][0], ideal[0][1] * 1.5), ideal[1]]
    ppp, overhead, details = fit_compute_and_overhead(DIGITS_LENET, skewed, START.device)
    assert overhead == 0.0 and "overhead_clamped" in details and 0 < ppp < 0.35


@pytest.mark.parametrize("shape, bound", [("as measured", None), ("growing faster than compute", "overhead_clamped"),
                                          ("growing slower than the peak allows", "compute_clamped")])
def test_repeats_in_equal_numbers_fit_as_their_means_do(shape, bound):
    """The workflow runs the short batch as often as the baseline repeats: the fit over every repeat is the fit
    through each batch's mean, also where it keeps a bound (and the end-to-end tests cannot choose which)."""
    ideal = {b: predict_point(replace(TRUTH, device=replace(TRUTH.device, ppp=1.0), overhead_s=0.0),
                              DIGITS_LENET, 1, b).iteration_s for b in (64, 8)}
    truth = {b: predict_point(TRUTH, DIGITS_LENET, 1, b).iteration_s for b in (64, 8)}
    means = {"as measured": truth,
             "growing faster than compute": {64: 1.5 * ideal[64] / 0.35, 8: ideal[8] / 0.35},
             "growing slower than the peak allows": {b: 0.02 + 0.5 * ideal[b] for b in (64, 8)}}[shape]
    repeats = [(64, means[64] * 1.04), (8, means[8] * 0.97), (64, means[64] * 0.96), (8, means[8] * 1.03)]
    ppp, overhead, details = fit_compute_and_overhead(DIGITS_LENET, repeats, START.device)
    mean_ppp, mean_overhead, mean_details = fit_compute_and_overhead(DIGITS_LENET, sorted(means.items()),
                                                                     START.device)
    assert ppp == pytest.approx(mean_ppp, rel=1e-9) and overhead == pytest.approx(mean_overhead, rel=1e-9, abs=1e-15)
    kept = {"overhead_clamped", "compute_clamped"}
    assert kept & details.keys() == kept & mean_details.keys() == ({bound} if bound else set())
    if bound is None:   # the fit goes through both means
        assert overhead == pytest.approx(0.0025, rel=1e-6) and ppp == pytest.approx(0.35, rel=1e-6)


def test_calibrate_command_reads_run_records_and_fits_the_overhead(repo, tmp_path):
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(run_record(train_result(64, 11.7))))
    short = tmp_path / "short.json"
    short.write_text(json.dumps(train_result(32, 7.5)))        # a bare trainer result.json works too
    measured = read_measured_iteration(base)
    assert measured.iteration_s == pytest.approx(0.0117) and measured.batch_per_rank == 64
    out = tmp_path / "calibration.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "calibrate", "--record", str(base),
                           "--record", str(short), "--input", "8,8,1", "--classes", "10", "--peak-tflops", "0.0768",
                           "--memory-gbs", "10", "--bandwidth-gbits", "40", "--latency-us", "0.5", "--out", str(out)],
                          capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    cal = load_calibration(out)
    assert 0.001 < cal.overhead_s < 0.005 and 0 < cal.ppp_compute < 1
    assert [r["batch_per_rank"] for r in cal.compute_source["records"]] == [64, 32]
    # The fitted model gives back both measured single-rank times.
    platform = cal.apply(Platform("command line", Device("d", 7.68e10, 1e10), Link(5e9, 5e-7), "tree"))
    assert predict_point(platform, DIGITS_LENET, 1, 64).iteration_s == pytest.approx(0.0117, rel=1e-6)
    assert predict_point(platform, DIGITS_LENET, 1, 32).iteration_s == pytest.approx(0.0075, rel=1e-6)


def test_unusable_records_are_named(tmp_path):
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps(run_record(None, outcome="failed")))
    with pytest.raises(FirescaleError, match="succeeded run"):
        read_measured_iteration(failed)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something/1"}))
    with pytest.raises(FirescaleError, match="neither"):
        read_measured_iteration(other)


@pytest.mark.parametrize("option", ["--probe-rounds", "--contention-rounds", "--short-runs"])
def test_rounds_below_one_are_refused_by_name_before_anything_runs(tmp_path, option):
    proc = run_firescale("predict", "calibrate", "--site", "local", "--batch", "64", "--iteration-s", "0.03",
                         "--net", "lenet_same", option, "0", "--out", tmp_path / "calibration.json")
    assert proc.returncode == 1 and f"{option} must be 1 or more, not 0" in proc.stderr
    assert not (tmp_path / "calibration.json").exists()


@pytest.mark.parametrize("option, value", [("--run-timeout", "0"), ("--probe-timeout", "-5")])
def test_time_limits_of_none_are_refused_by_name_before_anything_runs(tmp_path, option, value):
    proc = run_firescale("predict", "calibrate", "--site", "local", "--batch", "64", "--iteration-s", "0.03",
                         "--net", "lenet_same", option, value, "--out", tmp_path / "calibration.json")
    assert proc.returncode == 1 and f"{option} must be more than 0 seconds, not {value}" in proc.stderr
    assert not (tmp_path / "calibration.json").exists()


def test_short_run_repeats_the_recorded_run_at_another_batch(tmp_path):
    """The short run trains with the recorded run's options (its record's, else its command line's, as the
    trainer read it), less where it goes, its batch, resume and target; the learning rate scaled from its batch."""
    command = [*train_result(64, 10.0)["command"], "--crop", "6", "--target", "0.9", "--set", "base_lr=0.02"]
    argv = short_run_command(recorded_options({}, command, "base.json"), 16, 200, tmp_path / "s", 64)
    assert argv[1:4] == ["-m", "firescale", "train"] and argv[-2:] == ["--out", str(tmp_path / "s")]
    assert "--resume" not in argv and "/x" not in argv and "--total-batch" not in argv and "--target" not in argv
    assert argv[argv.index("--batch-per-rank") + 1] == "16" and argv[argv.index("--crop") + 1] == "6"
    assert argv[argv.index("--lr-scaling") + 1] == "linear" and argv[argv.index("--reference-batch") + 1] == "64"
    assert "base_lr=0.02" in argv and "max_iter=200" in argv and "test_interval=0" in argv
    with pytest.raises(FirescaleError, match="^base.json: the run record keeps neither its options nor a `firescale "
                                             "train` command line to repeat"):
        short_run_command(recorded_options({}, [], "base.json"), 16, 200, tmp_path, where="base.json")


@pytest.mark.tensorflow
@pytest.mark.slow
def test_calibrate_from_a_real_baseline_plus_a_short_run(repo, tmp_path):
    """The workflow's path: a 1-rank `firescale train` result, then `--short-run` repeats it at batch 8,
    `--short-runs` times one after the other (here 3, the second unable to write its folder: said and left
    out), and the fit goes through the mean of the runs at each batch."""
    _digits_baseline(repo, tmp_path, 100)
    out = tmp_path / "calibration.json"
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "calibrate-b8-r1").write_text("taken\n")
    proc = run_firescale("predict", "calibrate", "--site", "local", "--record", tmp_path / "base" / "result.json",
                         "--short-run", "100", "--short-batch", "8", "--short-runs", "3", "--workdir",
                         tmp_path / "short", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "firescale: short run round 2 of 3 left out: the short calibration run" in proc.stdout
    cal = load_calibration(out)
    records = cal.compute_source["records"]
    assert [(r["batch_per_rank"], r["iterations"]) for r in records] == [(64, 100), (8, 100), (8, 100)]
    assert [Path(r["source"]).parent.name for r in records[1:]] == ["calibrate-b8", "calibrate-b8-r2"]
    assert max(r["iteration_s"] for r in records[1:]) < records[0]["iteration_s"]
    assert cal.site == "local" and 0 < cal.ppp_compute <= 1 and cal.overhead_s >= 0
    # The input shape came from the record's dataset manifest (8x8 digits), not LeNet's 28x28 default.
    fitted = {r["batch"]: r["ideal_compute_s"] for r in cal.compute_source["runs"]}
    assert fitted[64] < 0.01
    source = cal.compute_source
    if "overhead_clamped" not in source and "compute_clamped" not in source:
        assert cal.overhead_s + fitted[8] / cal.ppp_compute == pytest.approx(
            (records[1]["iteration_s"] + records[2]["iteration_s"]) / 2, rel=1e-6)
    # An experiment with overlap_allreduce: the probe on 2 ranks also times the allreduce requested as the step's
    # backward pass starts, and the calibration keeps the share of it that ran beside the compute.
    overlapped = tmp_path / "overlapped.json"
    proc = run_firescale("predict", "calibrate", "--site", "local", "--record", tmp_path / "base" / "result.json",
                   "--allreduce-probe", "2", "--probe-overlap", "--out", overlapped)
    assert proc.returncode == 0, proc.stderr
    probed = load_calibration(overlapped)
    assert probed.comm_source["measured"] == "horovod" and probed.comm_source["ranks"] == 2
    assert probed.comm_hidden_share is not None and 0 <= probed.comm_hidden_share <= 1
    assert probed.comm_source["hidden_share"] == probed.comm_hidden_share
    assert f"{probed.comm_hidden_share:.0%} of it ran beside the compute" in proc.stdout


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_contention_round_whose_copies_fail_is_left_out_and_all_failing_is_the_error(repo, tmp_path):
    """A round of the short run's copies that fails (here a copy's --out is taken by a file, so its trainer
    cannot write there) is said and left out, and the contention is the median of the rounds that ran; with
    every round out, the first failure is the error, before the probe runs, and nothing is written."""
    _digits_baseline(repo, tmp_path, 60)

    def calibrate(workdir: Path, out: Path, blocked: list[int]):
        for k in blocked:     # copy 0 of round k cannot make its --out folder
            (workdir / f"contention-round-{k}").mkdir(parents=True)
            (workdir / f"contention-round-{k}" / "contention-b8-0").write_text("taken\n")
        return run_firescale("predict", "calibrate", "--site", "local", "--record", tmp_path / "base" / "result.json",
                             "--short-run", "30", "--short-batch", "8", "--allreduce-probe", "2",
                             "--contention-rounds", "2", "--probe-rounds", "1", "--workdir", workdir, "--out", out)

    out = tmp_path / "calibration.json"
    proc = calibrate(tmp_path / "one-out", out, [0])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "firescale: contention round 1 of 2 left out: the short calibration run" in proc.stdout
    assert "round 2 of 2 left out" not in proc.stdout
    assert "the median of 1 round(s)" in proc.stdout
    (contention,) = load_calibration(out).compute_source["contention"]["rounds"]
    assert contention["copies"] == 2 and len(contention["loaded_s"]) == 2
    assert (tmp_path / "one-out" / "contention-round-1" / "contention-b8-0" / "result.json").is_file()

    none = tmp_path / "none.json"
    proc = calibrate(tmp_path / "all-out", none, [0, 1])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("left out: the short calibration run") == 2
    assert "allreduce" not in proc.stdout     # the probe never ran
    assert "firescale: error: the short calibration run" in proc.stderr and "failed with exit code" in proc.stderr
    assert not none.exists()


def test_repeats_of_a_run_are_taken_as_their_mean_and_other_runs_are_refused():
    """The short run's repeats go into the contention and the probe's step as one run: the mean of each part
    and of the iteration; a run at another batch, or of other ranks, is not a repeat and is named."""
    from firescale.predict.measurements import MeasuredIteration, mean_iteration

    one = MeasuredIteration("a.json", "lenet_same", "digits", 1, 8, 0.010, 0.001, 0.008, 0.001, 100)
    two = MeasuredIteration("b.json", "lenet_same", "digits", 1, 8, 0.014, 0.001, 0.012, 0.001, 50)
    assert mean_iteration([one]) is one
    both = mean_iteration([one, two])
    assert (both.iteration_s, both.compute_s, both.iterations) == (pytest.approx(0.012), pytest.approx(0.010), 150)
    assert both.batch_per_rank == 8 and both.source == "mean of 2 runs: a.json, b.json"
    other = MeasuredIteration("c.json", "lenet_same", "digits", 1, 16, 0.02, 0.0, 0.02, 0.0, 100)
    with pytest.raises(FirescaleError, match=r"c\.json: 1 rank\(s\) at batch 16 a rank is not a repeat of a\.json"):
        mean_iteration([one, other])
    with pytest.raises(FirescaleError, match="no runs"):
        mean_iteration([])


@pytest.mark.tensorflow
def test_copies_faster_than_the_run_alone_leave_the_factor_at_1_and_keep_the_ratio(repo, tmp_path):
    """Ranks sharing a node do not compute faster than one alone: when the lone short run was disturbed (here
    it says 1 s an iteration, which no copy takes), the two real copies' median over it is kept as the ratio
    and the factor is 1, not a speed-up that would shrink every point's compute."""
    from firescale.predict.measurements import MeasuredIteration, contention

    proc = run_firescale("data", "ingest", "--source", "digits", "--out", tmp_path / "data")
    assert proc.returncode == 0, proc.stderr
    command = ("firescale", "train", "--dataset", str(tmp_path / "data" / "digits"), "--net", "lenet_same",
               "--solver", str(repo / "workflow" / "solvers" / "lenet-digits.yaml"), "--total-batch", "64",
               "--out", str(tmp_path / "base"))
    baseline = MeasuredIteration("base.json", "lenet_same", "digits", 1, 64, 0.01, 0.0, 0.01, 0.0, 100, command)
    disturbed = MeasuredIteration("alone.json", "lenet_same", "digits", 1, 8, 1.0, 0.0, 1.0, 0.0, 30)
    measured = contention(disturbed, baseline, 2, 30, tmp_path / "copies")
    assert len(measured["loaded_s"]) == 2 and max(measured["loaded_s"]) < 1.0
    assert measured["ratio"] == pytest.approx(sum(measured["loaded_s"]) / 2 / 1.0) and measured["ratio"] < 1
    assert measured["factor"] == 1.0 and measured["batch"] == 8


def test_a_short_run_past_its_time_limit_is_stopped_with_its_processes_and_said(tmp_path):
    """A short calibration run that outlives its limit (a file on a stalled filesystem: here its solver is a
    pipe nobody writes, so the trainer's read of it never returns) is one clear error, not a traceback, and
    nothing it started is left running."""
    from firescale.predict.measurements import MeasuredIteration, short_run

    os.mkfifo(tmp_path / "stalled.prototxt")
    baseline = MeasuredIteration("base.json", "lenet_same", "digits", 1, 64, 0.01, 0.0, 0.01, 0.0, 100,
                                 ("firescale", "train", "--dataset", str(tmp_path / "data"), "--net", "lenet_same",
                                  "--solver", str(tmp_path / "stalled.prototxt"), "--total-batch", "64",
                                  "--out", str(tmp_path / "base")))
    with pytest.raises(FirescaleError, match=r"the short calibration run \(.*--batch-per-rank 7 .*\) did not finish "
                                             r"in 2 s and was stopped"):
        short_run(baseline, 7, 100, tmp_path / "short", timeout=2.0)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "short" / "calibrate-b7")], capture_output=True, text=True)
    assert left.stdout == "", f"left running: {left.stdout}"


def test_comm_record_fits_communication_from_the_trainers_allreduce(repo, tmp_path):
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(run_record(train_result(64, 11.7))))
    two = tmp_path / "two.json"
    two.write_text(json.dumps(train_result(32, 10.5, ranks=2)))   # allreduce: a third of 10.5 ms
    out = tmp_path / "calibration.json"
    args = [sys.executable, "-m", "firescale", "predict", "calibrate", "--record", str(base), "--input", "8,8,1",
            "--classes", "10", "--peak-tflops", "0.0768", "--memory-gbs", "10", "--bandwidth-gbits", "40",
            "--latency-us", "0.5", "--out", str(out)]
    proc = subprocess.run(args + ["--comm-record", str(two)], capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    cal = load_calibration(out)
    assert cal.comm_source["fitted"] and cal.comm_source["ranks"] == 2 and cal.comm_source["source"] == str(two)
    assert cal.comm_source["bytes"] == 524_320                      # LeNet on 8x8 digits: 131,080 float32
    platform = cal.apply(Platform("command line", Device("d", 7.68e10, 1e10), Link(5e9, 5e-7), "tree"))
    assert predict_point(platform, DIGITS_LENET, 2, 64).comm_s == pytest.approx(0.0035, rel=1e-6)
    proc = subprocess.run(args + ["--comm-record", str(base)], capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 1 and "2 or more ranks" in proc.stderr


def test_an_unphysical_fit_keeps_the_device_at_its_peak_and_the_rest_as_overhead():
    # Noise made the smaller batch slower: the time does not grow with the batch as compute must.
    ideal = {b: predict_point(replace(START, device=replace(START.device, ppp=1.0)), DIGITS_LENET, 1, b).iteration_s
             for b in (64, 32)}
    cal = calibrate(START, DIGITS_LENET, 64, 0.010, more_runs=[(32, 0.011)])
    assert cal.ppp_compute == 1.0                                     # at most the peak
    assert cal.overhead_s == pytest.approx(((0.010 - ideal[64]) + (0.011 - ideal[32])) / 2)
    assert cal.compute_source["overhead_fitted"] is True
    assert "less than the peak allows" in cal.compute_source["compute_clamped"]
    assert [r["batch"] for r in cal.compute_source["runs"]] == [64, 32]  # the measurements stay on record
    # So the half batch is predicted from the overhead, not at half the baseline's time (Paleo's single factor).
    half = predict_point(cal.apply(START), DIGITS_LENET, 1, 32).iteration_s
    assert half > 0.0095 and half < 0.010
    # Faster than the peak at every batch: refused by name, and the baseline alone cannot calibrate either.
    with pytest.raises(FirescaleError, match="faster than the peak allows"):
        fit_compute_and_overhead(DIGITS_LENET, [(64, ideal[64] / 2), (32, ideal[32] / 2)], START.device)
    with pytest.raises(FirescaleError, match="faster than the peak allows"):
        calibrate(START, DIGITS_LENET, 64, ideal[64] / 2, more_runs=[(32, ideal[32] / 2)])


def test_the_allreduce_probe_measures_a_clusters_nodes_only_from_inside_its_job(repo, tmp_path):
    base = [sys.executable, "-m", "firescale", "predict", "calibrate", "--net", "lenet_same", "--batch", "64",
            "--iteration-s", "0.5", "--out", str(tmp_path / "c.json")]
    proc = subprocess.run([*base, "--site", "titan", "--allreduce-probe", "2"], capture_output=True, text=True,
                          cwd=repo, env={k: v for k, v in os.environ.items() if k != "PBS_JOBID"})
    assert proc.returncode == 1 and "whose scheduler is 'torque', but this is not one of its jobs" in proc.stderr
    assert "$PBS_JOBID is unset" in proc.stderr and "calibration job" in proc.stderr
    assert "--allreduce-json" in proc.stderr
    record = tmp_path / "baseline.json"     # a short run repeats a record: refused before it is read
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "calibrate", "--site", "titan", "--record",
                           str(record), "--short-run", "50"], capture_output=True, text=True, cwd=repo,
                          env={k: v for k, v in os.environ.items() if k != "PBS_JOBID"})
    assert proc.returncode == 1 and "--short-run measures on the nodes of site titan" in proc.stderr
    # Inside one of the site's jobs it measures: here that ends at titan's launcher, which this machine lacks.
    in_job = {**os.environ, "PBS_JOBID": "123.titan", "PATH": os.path.dirname(sys.executable)}
    proc = subprocess.run([*base, "--site", "titan", "--allreduce-probe", "2"], capture_output=True, text=True,
                          cwd=repo, env=in_job)
    assert proc.returncode == 1 and "not one of its jobs" not in proc.stderr, proc.stderr
    assert "aprun, the launcher of site titan's ranks, is not on the PATH here" in proc.stderr
    proc = subprocess.run(base + ["--site", "local", "--allreduce-probe", "2", "--allreduce-json", "x.json"],
                          capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 1 and "give one of --allreduce-json, --comm-record and --allreduce-probe" in proc.stderr
    proc = subprocess.run(base + ["--site", "local", "--probe-overlap"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "--probe-overlap times the allreduce probe beside its step: give --allreduce-probe" in proc.stderr
    assert not (tmp_path / "c.json").exists()


def test_a_probe_round_past_its_timeout_is_stopped_and_said_and_all_failing_is_the_error(repo, tmp_path):
    """Each round of the allreduce probe is stopped at --probe-timeout and left out with one line; with every
    round out, the first failure is the error and nothing is written."""
    out = tmp_path / "c.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "calibrate", "--site", "local", "--net",
                           "lenet_same", "--batch", "64", "--iteration-s", "0.05", "--allreduce-probe", "2",
                           "--probe-rounds", "2", "--probe-timeout", "0.5", "--out", str(out)],
                          capture_output=True, text=True, cwd=repo, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    left = [p for p in Path("/proc").glob("[0-9]*") if str(tmp_path).encode() in _cmdline(p)]
    assert not left, f"ranks of a stopped probe round still run: {left}"
    assert proc.stdout.count("firescale: allreduce probe round ") == 2 and "round 2 of 2 left out" in proc.stdout
    assert ("the Horovod allreduce probe (2 ranks on site local) did not finish in 0.5 s and was stopped"
            in proc.stderr)
    assert not out.exists()


@pytest.mark.pytorch
@pytest.mark.mpi
@pytest.mark.slow
def test_a_pytorch_baseline_is_calibrated_with_torch_distributeds_allreduce(repo, tmp_path):
    """A PyTorch experiment's calibration, as its job runs it, needs neither TensorFlow nor Horovod: the short run
    repeats the record's own trainer (--framework pytorch) and the probe times the trainer's allreduce of LeNet's
    gradients over 2 ranks on the process group they take under mpirun (auto: MPI's), which the communication
    factor is fitted to as measured (no cycle), priced as the site's MPI_Allreduce (its tree)."""
    _digits_baseline(repo, tmp_path, 60, "--framework", "pytorch")
    out = tmp_path / "calibration.json"
    proc = run_firescale("predict", "calibrate", "--site", "local", "--record", tmp_path / "base" / "result.json",
                         "--short-run", "30", "--short-batch", "8", "--allreduce-probe", "2", "--probe-rounds", "2",
                         "--contention-rounds", "1", "--workdir", tmp_path / "work", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cal = load_calibration(out)
    short = json.loads(Path(cal.compute_source["records"][1]["source"]).read_text())   # the short run's result
    assert short["versions"]["framework"] == "pytorch" and short["batch"]["batch_per_rank"] == 8
    comm = cal.comm_source
    assert comm["measured"] == "torch" and comm["fitted"] is True and comm["ranks"] == 2 and comm["seconds"] > 0
    assert comm["after_step_s"] == 0.0 and "cycle_s" not in comm and len(comm["rounds_s"]) == 2
    probes = sorted((tmp_path / "work").glob("allreduce-probe-*.json"))
    (measured,) = json.loads(probes[0].read_text())["measurements"]
    assert measured["algorithm"] == "torch" and measured["process_group"] == "mpi" == comm["process_group"]
    assert comm["algorithm"] == "tree"   # site local's allreduce: the MPI group's MPI_Allreduce runs it
    assert measured["bytes"] == comm["bytes"] == DIGITS_LENET_BYTES
    assert min(comm["rounds_s"]) == comm["seconds"]
    assert "measured: the pytorch trainer's (mpi process group) allreduce of lenet_same's" in proc.stdout
    assert cal.ppp_comm > 0 and cal.contention >= 1.0


def _digits_baseline(repo: Path, tmp_path: Path, iterations: int, *options: str) -> None:
    """Digits ingested into tmp_path/data and a 1-rank `firescale train` of LeNet on them at batch 64 for
    `iterations` (with the trainer's `options`), its record in tmp_path/base/result.json, as a sweep's baseline."""
    proc = run_firescale("data", "ingest", "--source", "digits", "--out", tmp_path / "data")
    assert proc.returncode == 0, proc.stderr
    proc = run_firescale("train", "--dataset", tmp_path / "data" / "digits", "--net", "lenet_same", "--solver",
                         repo / "workflow" / "solvers" / "lenet-digits.yaml", "--total-batch", "64",
                         "--out", tmp_path / "base", "--set", f"max_iter={iterations}", "--set", "test_interval=0",
                         "--set", "snapshot=0", *options)
    assert proc.returncode == 0, proc.stderr


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:       # gone meanwhile
        return b""
