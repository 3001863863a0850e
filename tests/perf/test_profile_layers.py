"""profile_layers: a real LeNet timed layer by layer on this CPU (one rank) by either backend, written and replayed
as a Table VI trace."""
from __future__ import annotations

import numpy as np
import pytest

from firescale.model.traces import read_trace, replay_trace, write_trace
from firescale.nets.zoo import get_net
from firescale.train.timing import median_seconds


@pytest.mark.tensorflow
def test_profile_a_small_lenet(tmp_path):
    import tensorflow as tf

    from firescale.train.tensorflow.distributed import Rank
    from firescale.train.tensorflow.nets import build_net
    from firescale.train.tensorflow.profile import profile_net

    spec = get_net("lenet_same", input_shape=(8, 8, 1))
    net = build_net(spec, seed=1)
    images = tf.constant(np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32))
    labels = tf.constant(np.arange(16) % 10, tf.int32)
    one_rank = Rank(rank=0, size=1, local_rank=0, local_size=1, device="/cpu:0", pinned_cpus=[], hvd=None)
    trace = profile_net(net, images, labels, one_rank, data_wait_s=0.002, repeats=3)
    # the trainer's data wait is I/O already exposed: recorded as such, not as the DAG model's I/O task
    assert [r.name for r in trace] == ["data_wait", *(layer.name for layer in spec.layers)]
    assert trace[0].forward_us == pytest.approx(2000.0) and trace[0].backward_us == 0
    assert all(r.forward_us > 0 and r.backward_us > 0 for r in trace[1:])
    conv1 = spec.layers[0]
    assert trace[1].gradient_bytes == (conv1.kernel * conv1.kernel * 1 * conv1.out + conv1.out) * 4
    pools = [r for r, layer in zip(trace[1:], spec.layers) if type(layer).__name__ == "Pool"]
    assert pools and all(r.gradient_bytes == 0 for r in pools) and all(r.comm_us == 0 for r in trace)
    again = read_trace(write_trace(tmp_path / "lenet.csv", trace))
    compute = sum(r.forward_us + r.backward_us for r in trace[1:])
    # so a replay adds it to the computation, overlapped or not, rather than hiding it a second time
    assert replay_trace(again).iteration == pytest.approx(compute + 2000.0, rel=1e-4)
    assert replay_trace(again, overlap=False).iteration == pytest.approx(compute + 2000.0, rel=1e-4)


@pytest.mark.pytorch
def test_the_pytorch_backend_traces_a_lenet_inside_real_iterations(tmp_path):
    from firescale.train.torch.backend import TorchBackend

    backend = TorchBackend("fp32")
    rank = backend.init_rank(1, 1)
    spec = get_net("lenet_same", input_shape=(8, 8, 1))
    net = backend.build_net(spec, 1, None, None)
    ones = [1.0] * len(net.infos)
    solver = backend.make_solver(_sgd(), net, [i.name for i in net.infos], ones, ones)
    steps = backend.make_steps(net, solver, rank, (8, 8, 1), overlap=False)
    images, labels = steps.batch(np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32),
                                 np.arange(16, dtype=np.int64) % 10)
    before = backend.read_params(net)
    trace = backend.profile_layers(net, images, labels, rank, data_wait_s=0.002, repeats=3)
    # the same rows as the TensorFlow backend's: the data wait, then every layer, the loss under its own name
    assert [r.name for r in trace] == ["data_wait", *(layer.name for layer in spec.layers)]
    assert [r.layer_id for r in trace] == list(range(len(trace)))
    assert trace[0].forward_us == pytest.approx(2000.0) and trace[0].backward_us == 0
    assert all(r.forward_us > 0 and r.backward_us > 0 for r in trace[1:])
    conv1 = spec.layers[0]
    assert trace[1].gradient_bytes == (conv1.kernel * conv1.kernel * 1 * conv1.out + conv1.out) * 4
    assert all(r.comm_us == 0 for r in trace)   # one rank sums nothing
    # the trainer's trace changes no weight: no update runs between its iterations
    assert all(np.array_equal(before[k], v) for k, v in backend.read_params(net).items())
    again = read_trace(write_trace(tmp_path / "lenet.json", trace))
    assert again == trace


def _sgd():
    from firescale.caffe.solver import SolverConfig

    return SolverConfig(base_lr=0.01, type="SGD", lr_policy="fixed")


def test_median_seconds_takes_the_middle_call_after_a_warm_up():
    # The warm-up call, the slowest, is not counted: counted, the middle of four would be ~0.165 s.  The
    # sleeps lie far apart, so that a sleep overslept on a busy machine (10 ms happened) cannot reorder them.
    calls = iter([0.8, 0.25, 0.001, 0.08])
    import time

    def fn():
        time.sleep(next(calls))

    assert 0.08 <= median_seconds(fn, 3) < 0.15
    with pytest.raises(Exception, match="repeats must be at least 1"):
        median_seconds(fn, 0)
