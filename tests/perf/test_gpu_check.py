"""`firescale bench gpu`, the GPU check, on a CPU: its smoke mode end to end with only what a GPU node has (no lmdb,
TensorFlow, Horovod or Snakemake), and its Markdown page of a GPU's record."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from firescale.bench.gpu_check import FILES, check_passed
from firescale.bench.gpu_summary import render_summary

# Absent on the GPU node (docs/gpu-check.md): hidden from every process of the check, as if not installed.
ABSENT_ON_THE_NODE = ("lmdb", "tensorflow", "horovod", "snakemake")
HIDE = """\
import os, sys
from importlib.machinery import PathFinder
_HIDDEN = tuple(os.environ["FIRESCALE_TEST_HIDDEN"].split(","))
class _Hiding(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        return None if fullname.split(".")[0] in _HIDDEN else super().find_spec(fullname, path, target)
sys.meta_path[:] = [_Hiding if f is PathFinder else f for f in sys.meta_path]
"""


@pytest.mark.pytorch
@pytest.mark.slow
def test_smoke_mode_runs_every_part_without_the_packages_a_gpu_node_lacks(tmp_path, repo):
    """Tiny nets, data and budgets: at most eight plain files come back, every part passed or was skipped for a
    reason given (the GPU tests without CUDA), bench trainer compared the trainer with the bare torch loop, the run
    trained on the CPU and both sides of every step timing report the same loss."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    env = {**os.environ, "FIRESCALE_TEST_HIDDEN": ",".join(ABSENT_ON_THE_NODE),
           "PYTHONPATH": os.pathsep.join([str(hide), str(repo / "src"), os.environ.get("PYTHONPATH", "")]),
           "FIRESCALE_CHECKOUT": str(repo)}    # run from elsewhere: the checkout named, not found from the package
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "firescale", "bench", "gpu", "--smoke", "--minutes", "1", "--out",
                           str(out), "--work", str(tmp_path / "work")], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = sorted(p.name for p in out.iterdir())
    assert all((out / name).is_file() for name in written) and len(written) <= 8
    assert set(written) <= set(FILES.values()) and {"summary.md", "gpu-check.json"} <= set(written)
    record = json.loads((out / "gpu-check.json").read_text())
    parts = {p["name"]: p for p in record["parts"]}
    assert check_passed(record) and record["smoke"]
    assert parts["tests"]["status"] == "skipped" and parts["tests"]["data"]["counts"].get("skipped", 0) >= 10
    train = parts["train"]["data"]["runs"]
    assert [r["device"] for r in train] == ["cpu"] and train[0]["iterations"] == 20
    # the bare torch loop is in this checkout: the bench part must have run and passed, not been skipped
    assert parts["bench"]["status"] == "passed", parts["bench"]
    assert parts["bench"]["data"]["dataset"] and (out / FILES["bench"]).is_file()
    rows = parts["steps"]["data"]["rows"]
    assert rows and all(r["status"] == "ok" and r["images_per_s"] > 0 for r in rows)
    losses = {}
    for r in rows:
        losses.setdefault((r["batch"], r["precision"]), []).append(r["loss"])
    assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in losses.values()), losses
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# The PyTorch backend on a CPU (smoke run)")
    assert "| steps | passed |" in summary and "## Steps of the ImageNet nets" in summary


@pytest.mark.parametrize("how", ["working folder", "variable", "option"])
def test_a_folder_without_the_gpu_tests_is_one_sentence_naming_how_it_was_chosen(tmp_path, repo, how):
    """The check finds its tests in the checkout named by --checkout, else $FIRESCALE_CHECKOUT, else the working
    folder (never by walking up from the package); a folder without them stops it before any part runs."""
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    env.pop("FIRESCALE_CHECKOUT", None)
    argv = [sys.executable, "-m", "firescale", "bench", "gpu", "--smoke", "--out", str(tmp_path / "out")]
    if how == "variable":
        env["FIRESCALE_CHECKOUT"] = str(tmp_path)
    elif how == "option":
        env["FIRESCALE_CHECKOUT"] = str(repo)          # the option wins over the variable
        argv += ["--checkout", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    said = {"working folder": "the working folder", "variable": "FIRESCALE_CHECKOUT", "option": "--checkout"}[how]
    assert proc.returncode != 0
    assert f"{said} {tmp_path} holds no tests/train/test_torch_gpu.py" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "gpu-check.json").exists()


def _side(net: str, batch: int, precision: str, side: str, speed: float, peak: int, status: str = "ok") -> dict:
    return {"net": net, "batch": batch, "precision": precision, "side": side, "status": status, "iterations": 10,
            "seconds": 1.0, "images_per_s": speed, "peak_bytes": peak, "start_bytes": 0, "loss": 6.9, "warm_up_s": 1.0}


def test_the_page_of_a_gpu_record_names_the_machine_and_pairs_the_sides():
    """A record shaped as a GPU gives it: the GPU, driver and versions in the head, the training runs against the
    baseline's target, each net's trainer beside its bare loop (percent; peaks less the check's copy of the
    starting state, the bare loop's also less the trainer solver's history)."""
    gib = 2 ** 30
    record = {
        "date": "2026-12-01", "commit": "abc123", "command": "firescale bench gpu --out x", "smoke": False,
        "minutes": 6.0, "seconds": 350.0,
        "device": {"device": "cuda:0", "name": "NVIDIA H200", "capability": "9.0", "memory_bytes": 141 * gib,
                   "multiprocessors": 132, "driver": "580.159.04", "cpus": 16, "python": "3.12.3", "torch": "2.11.0",
                   "cuda": "13.0", "cudnn": 91300, "nccl": "2.28.3", "numpy": "2.5.2"},
        "parts": [
            {"name": "tests", "status": "passed", "seconds": 60, "note": "", "data": {"counts": {"passed": 13}}},
            {"name": "train", "status": "passed", "seconds": 40, "note": "", "data": {
                "dataset": "fashion-mnist", "solver": "workflow/solvers/lenet-fashion.prototxt",
                "baseline": {"experiment": "fashion-lenet", "net": "lenet_same", "total_batch": 64, "top1": 0.849,
                             "tolerance": 0.01, "source": "zen5"},
                "runs": [{"precision": "fp32", "device": "cuda:0", "top1": 0.851, "iter": 469, "reached_target": True,
                          "time_to_accuracy_s": 4.2, "train_time_s": 4.5, "images_per_s": 9000.0}]}},
            {"name": "bench", "status": "skipped", "seconds": 0, "note": "not landed", "data": {}},
            {"name": "steps", "status": "passed", "seconds": 150, "note": "", "data": {
                "iterations": 10, "warm_up": 2, "cudnn": {"deterministic": True, "benchmark": False},
                "nets": {"vgg16": {"parameters": 138e6, "input": [224, 224, 3], "seconds": 6.0,
                                   "solver_history_bytes": gib, "initial_bytes": 2 * gib}},
                "syncs": {"net": "vgg16", "batch": 64, "precision": "fp32", "per_iteration": {"trainer": 1, "bare": 0}},
                "rows": [_side("vgg16", 64, "bf16", "trainer", 900.0, 10 * gib),
                         _side("vgg16", 64, "bf16", "bare", 1000.0, 9 * gib),
                         _side("vgg16", 256, "fp32", "trainer", 0.0, 0, "skipped: too slow"),
                         _side("vgg16", 256, "fp32", "bare", 0.0, 0, "skipped: too slow")]}},
        ]}
    page = render_summary(record)
    assert page.startswith("# The PyTorch backend on NVIDIA H200 (2026-12-01)")
    assert "driver 580.159.04; 16 CPU cores" in page and "CUDA 13.0, cuDNN 91300, NCCL 2.28.3" in page
    assert "| fp32 | cuda:0 | 0.8510 | 469 | yes | 4.20 s | 4.50 s | 9000 |" in page
    assert "| vgg16 | 64 | bf16 | 900 | 1000 | 90.0% | 8.00 | 6.00 | 6.9000 / 6.9000 |" in page
    assert "| vgg16 | 256 | fp32 | skipped: too slow | skipped: too slow | – |" in page
    assert "trainer 1, bare 0" in page and "Not run: not landed." in page
    assert not check_passed({"parts": [{"status": "passed"}, {"status": "timed out"}]})
