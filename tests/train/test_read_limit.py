"""`train --read-limit-mbs`: a run whose reads are slowed to a storage speed waits at least its batches' bytes / the
limit for data, trains the unlimited run's weights bit for bit, and says so in result.json; bad values and a resume
under another limit are refused."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, weights

from firescale.errors import FirescaleError
from firescale.train.checkpoint import check_same_read_limit

REPO = Path(__file__).resolve().parents[2]
LIMIT = 0.04          # MB/s: a batch of 16 digits (16 x 64 bytes) takes 25.6 ms to read
BATCH_BYTES = 16 * 8 * 8 * 1


def _train(work: Path, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "firescale", "train", "--dataset", str(work / "digits"), "--net", "lenet_same",
            "--solver", str(REPO / "workflow" / "solvers" / "lenet-digits.yaml"), "--batch-per-rank", "16",
            "--set", "max_iter=40", "--set", "test_interval=0", "--set", "snapshot=0", "--set", "display=0",
            "--set", "test_initialization=false", "--out", str(work / out), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.tensorflow
def test_a_limited_run_waits_its_bytes_over_the_limit_and_trains_the_same_weights(tmp_path):
    work = ingest_digits(tmp_path)
    runs = {}
    for name, extra in (("limited", ("--read-limit-mbs", str(LIMIT))), ("unlimited", ())):
        proc = _train(work, name, *extra)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs[name] = (proc.stdout, json.loads((work / name / "result.json").read_text()))
    (said, limited), (said_not, unlimited) = runs["limited"], runs["unlimited"]
    assert limited["read_limit_mbs"] == LIMIT and unlimited["read_limit_mbs"] is None
    assert f"reads limited to {LIMIT:g} MB/s per rank" in said and "reads limited" not in said_not
    assert limited["iterations"] == unlimited["iterations"] == 40
    # Every iteration's data wait is timed: the reads' sleeps are in it, whatever batches share a read.
    assert limited["per_iteration"]["data_wait_s"] >= BATCH_BYTES / (LIMIT * 1e6)
    ours = weights(work / "limited" / "snapshots" / "lenet-digits_iter_40.solverstate")
    theirs = weights(work / "unlimited" / "snapshots" / "lenet-digits_iter_40.solverstate")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "fast"])
def test_a_read_limit_that_is_not_a_positive_number_is_refused_naming_the_option(tmp_path, capsys, value):
    from firescale.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "--dataset", str(tmp_path), "--solver", "s.yaml", "--out", str(tmp_path / "o"),
              "--read-limit-mbs", value])
    assert exit_.value.code == 2
    assert (f"argument --read-limit-mbs: expected MB per second, a number above 0, not {value!r}"
            in capsys.readouterr().err)


def test_a_resume_under_another_read_limit_is_refused_with_one_sentence():
    check_same_read_limit({"read_limit_mbs": 0.5}, 0.5, "s.solverstate")
    check_same_read_limit({}, None, "old.solverstate")   # snapshots from before the option: no limit
    with pytest.raises(FirescaleError, match=r"^snapshot s.solverstate was written by a run with --read-limit-mbs "
                                             r"0.5 and this one runs without --read-limit-mbs; resume with the "
                                             r"read limit it had"):
        check_same_read_limit({"read_limit_mbs": 0.5}, None, "s.solverstate")
    with pytest.raises(FirescaleError, match="run without --read-limit-mbs and this one runs with --read-limit-mbs 2;"):
        check_same_read_limit({}, 2.0, "s.solverstate")
