"""Helpers shared by the training tests: a digits dataset, `firescale train` arguments, snapshot weights."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np


def ingest_digits(root: Path) -> Path:
    """scikit-learn's digits ingested under root/digits; returns root."""
    subprocess.run([sys.executable, "-m", "firescale", "data", "ingest", "--source", "digits", "--out", str(root)],
                   check=True, capture_output=True, text=True)
    return root


def train_args(work: Path, out: str, solver: str, *extra: str) -> list[str]:
    """`firescale train` of LeNet on work/digits with work/SOLVER into work/OUT."""
    return ["train", "--dataset", str(work / "digits"), "--net", "lenet_same", "--solver", str(work / solver),
            "--out", str(work / out), *extra]


def weights(path: Path) -> dict[str, np.ndarray]:
    """The weights (`weights/<layer>/<blob>`) and solver history (`history/<i>`) of a snapshot, read from
    Caffe's files as Caffe would: the .solverstate named, and the .caffemodel its learned_net names."""
    from firescale.caffe.caffemodel import read_weights
    from firescale.caffe.solverstate import read_solverstate

    state = read_solverstate(path)
    blobs = read_weights(path.with_name(Path(state.learned_net).name))
    out = {f"weights/{layer}/{i}": a for layer, arrays in blobs.items() for i, a in enumerate(arrays)}
    out.update({f"history/{i}": h for i, h in enumerate(state.history)})
    return out
