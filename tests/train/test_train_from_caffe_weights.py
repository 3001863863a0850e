"""`firescale train --weights FILE.caffemodel`: the run starts from Caffe's weights, copied by layer name.

The weights are Caffe's own trained LeNet (conv1, conv2, ip2 as Caffe wrote them; ip1 cut to the 8x8
digits' 200 inputs).  The loss at iteration 0 must be the one Caffe's arithmetic gives from those
weights: computed here in NumPy in Caffe's layouts (CHW images, OIHW kernels, InnerProduct over C, H, W).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits

from firescale.caffe.caffemodel import read_caffemodel, write_caffemodel
from firescale.data.readers import Transform, iter_test_arrays, open_dataset

pytestmark = pytest.mark.tensorflow

CAFFE_LENET = Path(__file__).parents[1] / "caffe" / "data" / "lenet_iter_10000.caffemodel"
SOLVER = "type: SGD\nbase_lr: 0.01\nmomentum: 0.9\nmax_iter: 2\ntest_interval: 2\nrandom_seed: 5\n"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def _conv_same(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Caffe's convolution of NCHW images with OIHW weights, pad 2 (the zoo's LeNet), stride 1."""
    x = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    k = w.shape[2]
    h, wd = x.shape[2] - k + 1, x.shape[3] - k + 1
    patches = np.stack([x[:, :, i:i + h, j:j + wd] for i in range(k) for j in range(k)], axis=2)  # N C KK H W
    return np.einsum("ncphw,ocp->nohw", patches, w.reshape(w.shape[0], w.shape[1], k * k)) + b[None, :, None, None]


def _pool(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def _caffe_loss(blobs: dict[str, list[np.ndarray]], images: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Mean softmax loss and top-1 of LeNet on NHWC `images`, by Caffe's arithmetic in float64."""
    f = {k: [a.astype(np.float64) for a in v] for k, v in blobs.items()}
    x = images.astype(np.float64).transpose(0, 3, 1, 2)
    x = _pool(_conv_same(x, *f["conv1"]))
    x = _pool(_conv_same(x, *f["conv2"]))
    x = np.maximum(x.reshape(len(x), -1) @ f["ip1"][0].T + f["ip1"][1], 0)   # the C, H, W flattening
    logits = x @ f["ip2"][0].T + f["ip2"][1]
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean()), float((logits.argmax(axis=1) == labels).mean())


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("weights"))
    (root / "s.yaml").write_text(SOLVER)
    return root


@pytest.mark.slow
def test_training_starts_from_caffes_weights(work):
    caffe = read_caffemodel(CAFFE_LENET)
    blobs = {"conv1": caffe["conv1"], "conv2": caffe["conv2"],
             "ip1": [np.ascontiguousarray(caffe["ip1"][0][:, :200]), caffe["ip1"][1]], "ip2": caffe["ip2"],
             "fc_other": [np.ones((2, 2), np.float32)]}
    weights = write_caffemodel(work / "start.caffemodel", blobs, "LeNet")
    out = work / "run"
    proc = subprocess.run([sys.executable, "-m", "firescale", "train", "--dataset", str(work / "digits"), "--net",
                           "lenet_same", "--solver", str(work / "s.yaml"), "--out", str(out), "--total-batch", "32",
                           "--weights", str(weights)], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (f"weights from {weights}: copied conv1, conv2, ip1, ip2; layers of the file not in net 'lenet_same', "
            "ignored: fc_other") in proc.stdout

    ds = open_dataset(work / "digits", "test")
    batches = list(iter_test_arrays(ds, Transform(scale=1 / 255), rank=0, size=1, batch=1000))
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches]).astype(np.int64)
    loss, top1 = _caffe_loss(blobs, images, labels)
    first = json.loads((out / "result.json").read_text())["evals"][0]
    assert first["iter"] == 0 and len(labels) == 359
    assert first["loss"] == pytest.approx(loss, rel=1e-5) and first["top1"] == pytest.approx(top1, abs=1e-9)
    # The fillers' loss (about ln 10) is far from this: the run really started from Caffe's weights.
    assert abs(loss - np.log(10)) > 0.05
    # The run's trajectory records which weights it started from.
    run_state = json.loads((out / "snapshots" / "s_iter_2.firescale.json").read_text())
    assert run_state["trajectory"]["weights"]["file"] == "start.caffemodel"


@pytest.mark.slow
def test_a_truncated_weights_file_is_refused_and_nothing_is_written(work):
    cut = work / "cut.caffemodel"
    cut.write_bytes(CAFFE_LENET.read_bytes()[:100_000])
    proc = subprocess.run([sys.executable, "-m", "firescale", "train", "--dataset", str(work / "digits"), "--net",
                           "lenet_same", "--solver", str(work / "s.yaml"), "--out", str(work / "cut-run"),
                           "--total-batch", "32", "--weights", str(cut)], capture_output=True, text=True, timeout=300,
                          env=ENV)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("firescale: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0].startswith(f"firescale: error: {cut} cannot be read as a Caffe NetParameter (.caffemodel)")
    assert errors[0].endswith("the file is truncated, damaged or of another kind")
    assert not (work / "cut-run").exists()
