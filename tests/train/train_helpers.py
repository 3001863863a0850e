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
    return ["train", "--dataset", str(work / "digits"), "--net", "lenet", "--solver", str(work / solver),
            "--out", str(work / out), *extra]


def weights(path: Path) -> dict[str, np.ndarray]:
    """The weights and solver history of a snapshot."""
    with np.load(path) as data:
        return {k: data[k] for k in data.files if k.startswith(("weights/", "solver/"))}
