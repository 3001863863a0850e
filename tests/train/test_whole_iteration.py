"""Each iteration as one graph, the split timed on a few iterations in parts, losses read every few iterations:
how the split is made up and recorded, when the host reads, a diverged loss caught.  (That whole iterations
train the weights of iterations in parts, bit for bit on two ranks, test_trainer_mpi checks.)"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, train_args

from firescale.train.readback import READ_EVERY, read_due
from firescale.train.timing import SplitSums

DIVERGING = """\
type: SGD
base_lr: 1000000
momentum: 0.9
weight_decay: 0.0005
lr_policy: inv
gamma: 0.0001
power: 0.75
max_iter: 30
test_interval: 0
display: 0
snapshot: 15
test_initialization: false
random_seed: 5
"""


def test_the_split_divides_the_mean_iteration_as_the_iterations_in_parts_did():
    sums = SplitSums()
    sums.add(0.001, 0.006, 0.002)          # timed in parts: the host waits between them
    for _ in range(3):
        sums.add_whole(0.001, 0.007)       # one graph call: compute and allreduce together
    mean = sums.mean(split_every=4)
    assert mean.iterations == 4 and mean.split_iterations == 1 and mean.split_every == 4
    assert mean.data_wait_s == pytest.approx(0.001)
    assert mean.compute_s + mean.allreduce_s == pytest.approx((0.008 + 3 * 0.007) / 4)
    assert mean.allreduce_s / mean.compute_s == pytest.approx(0.002 / 0.006)
    # a snapshot from before whole iterations timed every iteration in parts
    old = SplitSums(**{"data_wait_s": 0.1, "compute_s": 0.5, "allreduce_s": 0.2, "iterations": 100})
    assert old.split_iterations == 100 and old.mean().allreduce_s == pytest.approx(0.002)
    both = old.plus(sums)
    assert both.iterations == 104 and both.split_iterations == 101
    assert SplitSums(**both.to_dict()) == both


def test_the_host_reads_every_few_iterations_and_wherever_the_loop_looks():
    assert [i for i in range(1, 31) if read_due(i, (0, 0, 0), 30)] == [READ_EVERY, 2 * READ_EVERY, 30]
    assert read_due(7, (7, 0, 0), 30) and read_due(12, (0, 4, 0), 30) and read_due(9, (0, 0, 3), 30)
    assert not read_due(7, (0, 4, 3), 30)


def test_losses_are_read_in_order_and_a_diverged_one_names_its_iteration():
    from firescale.errors import FirescaleError
    from firescale.train.readback import LossReads

    reads = LossReads(average_loss=2)     # the pairs as any backend leaves them, read back by np.asarray
    for loss, flag in ((6.0, 0.0), (4.0, 1.0), (2.0, 1.0)):
        reads.add(np.array([loss, flag], np.float32), 2)
    assert reads.read(3) is True and reads.average == pytest.approx(1.5)  # the last two, per image
    reads.add(np.array([1.0, 0.0], np.float32), 2)
    reads.add(np.array([np.nan, 0.0], np.float32), 2)
    with pytest.raises(FirescaleError, match="became nan at iteration 5"):
        reads.read(5)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("whole"))
    (root / "diverges.yaml").write_text(DIVERGING)
    return root


@pytest.mark.tensorflow
def test_a_diverging_loss_stops_the_run_naming_the_iteration(work):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "firescale", *train_args(work, "nan", "diverges.yaml")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the training loss became" in proc.stderr and "lower base_lr (solver key 'base_lr')" in proc.stderr
    iteration = int(proc.stderr.split("at iteration ")[1].split(";")[0])
    assert 1 <= iteration <= 15
    # no snapshot of a diverged net
    assert not (work / "nan" / "snapshots" / "diverges_iter_15.firescale.json").exists()
