"""Acceptance: Paleo's FireCaffe/NiN estimates (Table 3) within 3%, sweeps, calibration."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from firescale.errors import FirescaleError
from firescale.model.comm import Link
from firescale.model.paleo import (
    PALEO_TABLE2_NIN_STEP_S,
    PALEO_TABLE3,
    Device,
    Platform,
    firecaffe_case,
    firecaffe_platform,
    predict_point,
    predict_sweep,
)
from firescale.predict.calibrate import calibrate, load_calibration, save_calibration


def test_paleo_table3_within_3_percent():
    rows = firecaffe_case()
    for row, pred in rows:
        assert pred.time_to_accuracy_s == pytest.approx(row.paleo_s, rel=0.03), (row, pred.time_to_accuracy_s)
    # speedups against 1 GPU at batch 256, as in the table
    base = rows[0][1].time_to_accuracy_s
    for row, pred in rows[1:]:
        assert base / pred.time_to_accuracy_s == pytest.approx(row.paleo_speedup, rel=0.03)


def test_paleo_table2_one_step_and_every_per_gpu_batch_within_3_percent():
    # Table 2's one step (NiN, batch 256, one K20X) is the iteration behind Table 3's first row.
    rows = firecaffe_case()
    assert rows[0][1].iteration_s == pytest.approx(PALEO_TABLE2_NIN_STEP_S, rel=0.03)
    # Table 3's rows cover 256, 32 and 8 images per GPU (32 x 256 and 128 x 1024 both give 8); the
    # iteration each row implies (its time over its iterations) is matched at every one of them.
    assert sorted({pred.batch_per_gpu for _, pred in rows}) == [8, 32, 256]
    for row, pred in rows:
        assert pred.iteration_s == pytest.approx(row.paleo_s / pred.iterations, rel=0.03), row


def test_a_platform_names_a_known_accounting():
    with pytest.raises(FirescaleError, match="accounting must be one of firescale, paleo, not 'caffe'"):
        Platform("t", Device("d", 1e12, 1e11), Link(1e9), "tree", accounting="caffe")


def test_the_model_is_optimistic_against_firecaffe_measurements():
    # FireCaffe's measured times are 15-36% longer than the model's, growing with the GPU count.
    ratios = [pred.time_to_accuracy_s / row.firecaffe_s for row, pred in firecaffe_case()]
    assert all(0.6 < r < 0.9 for r in ratios)
    assert ratios[3] < ratios[0]


def test_paleo_cli_shows_ratios_to_firecaffe(repo, tmp_path):
    out = tmp_path / "t3.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "paleo", "--json", str(out)],
                          capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "ours/FireCaffe" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["gpus"] for r in rows] == [row.gpus for row in PALEO_TABLE3]
    assert rows[0]["ratio_to_firecaffe"] == pytest.approx(rows[0]["time_to_accuracy_s"] / (5.8 * 86400))


def test_strong_and_weak_scaling_and_overlap():
    platform = firecaffe_platform()
    strong = predict_sweep(platform, "nin", [1, 2, 4], [256], epochs=1)
    assert [p.batch_per_gpu for p in strong] == [256, 128, 64]
    assert strong[0].speedup == pytest.approx(1.0)
    assert strong[2].speedup > strong[1].speedup > 1
    weak = predict_point(platform, "nin", 4, 64, scaling="weak")
    assert weak.batch == 256 and weak.batch_per_gpu == 64
    overlapped = predict_point(platform, "nin", 32, 256, overlap=True)
    assert overlapped.iteration_s < overlapped.iteration_sequential_s
    assert overlapped.iteration_s >= overlapped.forward_s + overlapped.backward_s


def test_sweep_cli_writes_json(repo, tmp_path):
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "sweep", "--net", "lenet_same",
                           "--input", "8,8,1", "--dataset-size", "1437", "--epochs", "10", "--gpus", "1,2",
                           "--batch", "64", "--peak-tflops", "0.0768", "--memory-gbs", "10",
                           "--bandwidth-gbits", "40", "--latency-us", "0.5", "--json", str(out)],
                          capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    points = json.loads(out.read_text())["points"]
    assert [p["gpus"] for p in points] == [1, 2]
    assert points[0]["iterations"] == 225                  # ceil(10 * 1437 / 64)
    assert points[1]["comm_s"] > 0 and points[0]["comm_s"] == 0


def test_calibration_recovers_the_factors_and_round_trips(tmp_path):
    truth = Platform("t", Device("d", 1e12, 1e11, ppp=0.3), Link(1e9, 1e-6, ppp=0.6), "tree")
    measured = predict_point(truth, "lenet_same", 1, 64).iteration_s
    start = Platform("t", Device("d", 1e12, 1e11), Link(1e9, 1e-6), "tree")
    nbytes = 1e7
    from firescale.model.comm import allreduce_time
    seconds = allreduce_time("tree", nbytes, 4, truth.link)
    cal = calibrate(start, "lenet_same", 64, measured, {"algorithm": "tree", "bytes": nbytes, "ranks": 4,
                                                    "seconds": seconds})
    assert cal.ppp_compute == pytest.approx(0.3, rel=1e-6)
    assert cal.ppp_comm == pytest.approx(0.6, rel=1e-6)
    path = save_calibration(tmp_path / "calibration.json", cal)
    again = load_calibration(path)
    assert predict_point(start, "lenet_same", 4, 256, calibration=again).iteration_s == pytest.approx(
        predict_point(truth, "lenet_same", 4, 256).iteration_s)
    assert again.comm_hidden_share is None and again.apply(replace(start, comm_hidden_share=0.0)
                                                           ).comm_hidden_share == 0.0   # the site's kind decides
    with pytest.raises(FirescaleError, match="faster than the peak"):
        calibrate(start, "lenet_same", 64, measured / 10)


def test_a_probes_hidden_share_goes_through_the_calibration_to_the_overlapped_schedule(tmp_path):
    cpu = Platform("t", Device("d", 1e12, 1e11), Link(1e8, 1e-6), "tree", comm_hidden_share=0.0)
    measured = predict_point(cpu, "lenet_same", 1, 64).iteration_s
    probe = {"algorithm": "tree", "bytes": 1e7, "ranks": 2, "seconds": 0.2, "hidden_share": 0.4}
    cal = calibrate(cpu, "lenet_same", 64, measured, probe)
    assert cal.comm_hidden_share == 0.4 and cal.comm_source["hidden_share"] == 0.4
    again = load_calibration(save_calibration(tmp_path / "calibration.json", cal))
    assert again.comm_hidden_share == 0.4 and again.apply(cpu).comm_hidden_share == 0.4
    grouped = predict_point(cpu, "lenet_same", 2, 512, calibration=again)
    overlapped = predict_point(cpu, "lenet_same", 2, 512, calibration=again, overlap=True)
    assert overlapped.iteration_s < grouped.iteration_s == overlapped.iteration_sequential_s
    assert predict_point(cpu, "lenet_same", 2, 512, calibration=replace(again, comm_hidden_share=None),
                         overlap=True).iteration_s == grouped.iteration_s   # unmeasured: a CPU site hides none
    data = json.loads((tmp_path / "calibration.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**data, "comm_hidden_share": 1.5}))
    with pytest.raises(FirescaleError, match="comm_hidden_share must be in \\[0, 1\\]"):
        load_calibration(tmp_path / "bad.json")
    with pytest.raises(FirescaleError, match="comm_hidden_share must be in"):
        replace(cpu, comm_hidden_share=-0.1)
