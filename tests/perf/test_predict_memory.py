"""`firescale predict memory`: the per-layer table, planned and given splits, the Fig. 2 plot, the measurement."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from vgg19_hand_count import peak_at_backward

REPO = Path(__file__).resolve().parents[2]


def _memory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "firescale", "predict", "memory", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_vgg19_on_titan_split_in_two_with_its_plot(tmp_path):
    proc = _memory("vgg19", "--batch", "64", "--site", "titan", "--devices", "2", "--plot", str(tmp_path / "m.png"),
                   "--json", str(tmp_path / "m.json"))
    assert proc.returncode == 0, proc.stderr
    # each device's peak counted by hand (vgg19_hand_count): the first at conv2_2's backward pass, the second,
    # which holds the copy of pool2's output, at conv4_4's
    first = peak_at_backward(64, "conv2_2", last="pool2")
    second = peak_at_backward(64, "conv4_4", first="conv3_1")
    assert (f"split that fits: conv1_1..pool2 on device 0 ({first / 1e9:.2f} GB), conv3_1..loss on device 1 "
            f"({second / 1e9:.2f} GB)") in proc.stdout                                 # 5.48 and 4.58 GB
    assert 'layer_assign { name: "conv3_1" device: 1 }' in proc.stdout
    assert (tmp_path / "m.png").stat().st_size > 10_000 and (tmp_path / "m.pdf").exists()
    data = json.loads((tmp_path / "m.json").read_text())
    assert sorted(set(data["devices"])) == [0, 1] and [p["bytes"] for p in data["peaks"]] == [first, second]
    alone = _memory("vgg19", "--batch", "64", "--site", "titan")
    whole = peak_at_backward(64, "conv4_4")                                             # 8.811 GB
    assert f"device 0: peak {whole / 1e9:.3f} GB at conv4_4 (backward)" in alone.stdout
    assert f"{(whole - 6e9) / 1e9:.2f} GB over the 6 GB of titan's device" in alone.stdout    # 2.81 GB


def test_a_plan_over_a_device_is_refused_and_unequal_devices_are_planned(tmp_path):
    solver = tmp_path / "s.prototxt"
    solver.write_text('base_lr: 0.01\nmax_iter: 10\ndist { arch { layer_assign { name: "conv5_1", device: 1 } } }\n')
    proc = _memory("vgg19", "--batch", "64", "--site", "titan", "--solver", str(solver))
    assert proc.returncode == 1
    assert f"{solver}: dist (train) arch 0 leaves device 0 over its memory: " in proc.stderr
    proc = _memory("vgg19", "--batch", "32", "--limits", "6.35,4.49,8.80")
    assert proc.returncode == 0 and proc.stdout.count("device ") >= 3 and "split that fits" in proc.stdout


@pytest.mark.tensorflow
def test_measure_prints_the_model_beside_tensorflow():
    proc = _memory("lenet_same", "--batch", "16", "--device-kind", "cpu", "--measure", "--solver-type", "Adam")
    assert proc.returncode == 0, proc.stderr
    assert "| ip1 (+relu1) |" in proc.stdout and "Peak in use during forward and backward" in proc.stdout
