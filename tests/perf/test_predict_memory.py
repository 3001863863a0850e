"""`firescale predict memory`: the per-layer table, planned and given splits, the Fig. 2 plot, the measurement."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _memory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "firescale", "predict", "memory", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_vgg19_on_titan_split_in_two_with_its_plot(tmp_path):
    proc = _memory("vgg19", "--batch", "64", "--site", "titan", "--devices", "2", "--plot", str(tmp_path / "m.png"),
                   "--json", str(tmp_path / "m.json"))
    assert proc.returncode == 0, proc.stderr
    assert "split that fits: conv1_1..pool2 on device 0 (5.48 GB), conv3_1..loss on device 1 (4.58 GB)" in proc.stdout
    assert 'layer_assign { name: "conv3_1" device: 1 }' in proc.stdout
    assert (tmp_path / "m.png").stat().st_size > 10_000 and (tmp_path / "m.pdf").exists()
    data = json.loads((tmp_path / "m.json").read_text())
    assert sorted(set(data["devices"])) == [0, 1] and all(p["bytes"] <= 6e9 for p in data["peaks"])
    alone = _memory("vgg19", "--batch", "64", "--site", "titan")
    assert "device 0: peak 8.811 GB" in alone.stdout and "2.81 GB over the 6 GB of titan's device" in alone.stdout


def test_a_plan_over_a_device_is_refused_and_unequal_devices_are_planned(tmp_path):
    solver = tmp_path / "s.prototxt"
    solver.write_text('base_lr: 0.01\nmax_iter: 10\ndist { arch { layer_assign { name: "conv5_1", device: 1 } } }\n')
    proc = _memory("vgg19", "--batch", "64", "--site", "titan", "--solver", str(solver))
    assert proc.returncode == 1
    assert f"{solver}: dist (train) arch 0 leaves device 0 over its memory: " in proc.stderr
    proc = _memory("vgg19", "--batch", "32", "--limits", "6.35,4.49,8.80")
    assert proc.returncode == 0 and proc.stdout.count("device ") >= 3 and "split that fits" in proc.stdout


def test_measure_prints_the_model_beside_tensorflow():
    proc = _memory("lenet_same", "--batch", "16", "--device-kind", "cpu", "--measure", "--solver-type", "Adam")
    assert proc.returncode == 0, proc.stderr
    assert "| ip1 (+relu1) |" in proc.stdout and "Peak in use during forward and backward" in proc.stdout
