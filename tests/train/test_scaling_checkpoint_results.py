"""Batch/LR scaling rules, snapshot files and result records."""
from __future__ import annotations

import math

import numpy as np
import pytest

from firescale.errors import FirescaleError
from firescale.results import EvalPoint, IterationSplit, Segment, TrainResult, baseline_top1, read_result, write_result
from firescale.train.scaling import plan_batches
from firescale.train.timing import time_to_accuracy


def test_firecaffe_linear_rule_batch_x4_lr_x4():
    plan = plan_batches(4, batch_per_rank=256, lr_scaling="linear")  # reference: one worker's 256
    assert (plan.total_batch, plan.lr_scale) == (1024, 4.0)
    assert plan_batches(4, batch_per_rank=256, lr_scaling="sqrt").lr_scale == 2.0
    assert plan_batches(4, batch_per_rank=256, lr_scaling="none").lr_scale == 1.0


def test_total_batch_is_split_and_keeps_the_rate_by_default():
    plan = plan_batches(8, total_batch=1024, lr_scaling="linear")
    assert (plan.batch_per_rank, plan.lr_scale) == (128, 1.0)
    assert plan_batches(8, total_batch=1024, lr_scaling="linear", reference_batch=256).lr_scale == 4.0
    with pytest.raises(FirescaleError, match="multiple of the 3 ranks"):
        plan_batches(3, total_batch=1024)
    with pytest.raises(FirescaleError, match="exactly one"):
        plan_batches(2, batch_per_rank=1, total_batch=2)


def test_warmup_ramps_from_the_unscaled_rate():
    plan = plan_batches(4, batch_per_rank=32, lr_scaling="linear", warmup_iters=10, iter_size=2)
    assert plan.effective_batch == 256 and plan.lr_scale == 8.0
    assert plan.warmup_factor(0) == pytest.approx(1 / 8)
    assert plan.warmup_factor(5) == pytest.approx(1 / 8 + (7 / 8) / 2)
    assert plan.warmup_factor(10) == plan.warmup_factor(1000) == 1.0
    plain = plan_batches(1, batch_per_rank=32, warmup_iters=4)
    assert [plain.warmup_factor(i) for i in range(5)] == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1.0])


def test_a_sweep_point_warms_up_from_the_baselines_rate():
    """A sweep sets base_lr to the point's own rate (0.4 at 4x the batch) and names the baseline's 0.1:
    the ramp starts at 0.1, a quarter of the point's rate, not at 1/warmup_iters of it."""
    plan = plan_batches(2, total_batch=256, warmup_iters=10, base_lr=0.4, warmup_start_lr=0.1)
    assert plan.lr_scale == 1.0 and plan.warmup_start_lr == 0.1
    assert 0.4 * plan.warmup_factor(0) == pytest.approx(0.1)
    assert 0.4 * plan.warmup_factor(5) == pytest.approx(0.25)
    assert plan.warmup_factor(10) == 1.0
    # a point at or below the baseline's rate needs no warm-up
    assert plan_batches(1, total_batch=64, warmup_iters=10, base_lr=0.05, warmup_start_lr=0.1).warmup_factor(0) == 1.0
    with pytest.raises(FirescaleError, match="--warmup-start-lr must be positive"):
        plan_batches(1, total_batch=64, warmup_iters=10, base_lr=0.05, warmup_start_lr=0.0)


def _result(evals):
    return TrainResult(
        net="lenet_same", dataset="d", dataset_manifest_sha256="abc", ranks=2, solver={}, batch={}, seed=1,
        data_seed=1, target_top1=0.9, target_source="t", reached_target=True, time_to_accuracy_s=2.0,
        train_time_s=3.0, iterations=10, epochs=0.5, images_per_s=100.0,
        per_iteration=IterationSplit(0.001, 0.01, 0.002, 10), allreduce={"algorithm": "ring"}, hostnames=["h"],
        versions={}, evals=evals, segments=[Segment(0, 10, 1.0, 3.0, 0.5, 640, "finished", ["h"])],
        status="target_reached")


def test_result_round_trip_baseline_and_time_to_accuracy(tmp_path):
    evals = [EvalPoint(5, 0.25, 1.0, 0.8, 0.99, 0.5), EvalPoint(10, 0.5, 2.0, 0.93, 1.0, 0.2)]
    path = write_result(tmp_path / "result.json", _result(evals))
    back = read_result(path)
    assert back.evals[1].top1 == 0.93 and back.segments[0].images == 640 and back.per_iteration.iterations == 10
    assert baseline_top1(path) == 0.93
    assert time_to_accuracy(evals, 0.9) == 2.0 and time_to_accuracy(evals, 0.8) == 1.0
    assert time_to_accuracy(evals, 0.95) is None and time_to_accuracy(evals, None) is None


def test_bad_result_names_the_key(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"net": "lenet_same"}')
    with pytest.raises(FirescaleError, match="missing key"):
        read_result(path)
    with pytest.raises(FirescaleError, match=r"absent.json does not exist"):
        read_result(tmp_path / "absent.json")


@pytest.mark.tensorflow
def test_caffe_pooling_rounds_up_and_averages_like_caffe():
    import tensorflow as tf

    from firescale.nets.spec import Pool
    from firescale.train.tensorflow.nets import _pool

    x = np.arange(1 * 5 * 5 * 1, dtype=np.float32).reshape(1, 5, 5, 1)
    out = _pool(Pool("p", "max", 2, 2), tf.constant(x)).numpy()
    assert out.shape == (1, 3, 3, 1)  # Caffe: ceil((5 - 2) / 2) + 1 = 3
    assert out[0, 2, 2, 0] == 24 and out[0, 0, 0, 0] == 6
    avg = _pool(Pool("p", "avg", 3, 2, pad=1), tf.constant(x)).numpy()
    # Caffe's AVE pooling: window clipped to the padded image, padding counted in the divisor
    h = 5
    for i in range(avg.shape[1]):
        for j in range(avg.shape[2]):
            hs, ws = i * 2 - 1, j * 2 - 1
            he, we = min(hs + 3, h + 1), min(ws + 3, h + 1)
            size = (he - hs) * (we - ws)
            window = x[0, max(hs, 0):min(he, h), max(ws, 0):min(we, h), 0]
            assert avg[0, i, j, 0] == pytest.approx(window.sum() / size)


def test_fillers_follow_caffe():
    """The blobs both backends start from (train/params.py), drawn from Caffe's fillers."""
    from firescale.nets.zoo import get_net
    from firescale.train.params import initial_blobs

    def blobs(name: str, shape: tuple[int, int, int], seed: int) -> dict[str, np.ndarray]:
        return {info.name: value for _, info, value in initial_blobs(get_net(name, num_classes=10, input_shape=shape),
                                                                     seed)}

    net = blobs("lenet_same", (8, 8, 1), 5)
    w = net["conv1/weights"]
    bound = math.sqrt(3.0 / (1 * 5 * 5))  # xavier: uniform +-sqrt(3 / fan_in)
    assert w.shape == (5, 5, 1, 20) and np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert not net["conv1/bias"].any()
    again = blobs("lenet_same", (8, 8, 1), 5)
    assert net.keys() == again.keys() and all(np.array_equal(net[k], again[k]) for k in net)
    nin = blobs("nin", (64, 64, 3), 1)
    assert np.std(nin["cccp1/weights"]) == pytest.approx(0.01, rel=0.05)  # FireCaffe 7.1
    assert np.std(nin["conv1/weights"]) == pytest.approx(0.05, rel=0.05)
