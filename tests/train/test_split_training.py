"""A net split by layers over logical devices (Oh and Lee's model parallelism): each layer on its device,
copies at the boundaries, the same weights and accuracy as on one device, and Horovod replicas of it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, train_args, weights

from firescale.cluster.site import load_site

pytestmark = pytest.mark.tensorflow

SOLVER = """\
type: SGD
base_lr: 0.05
momentum: 0.9
weight_decay: 0.0005
lr_policy: inv
gamma: 0.0001
power: 0.75
max_iter: 60
test_interval: 20
display: 20
snapshot: 30
random_seed: 3
"""
# The seed's form in a Caffe solver.prototxt: conv2 to relu1 on device 1, the rest on device 0.
DIST = """
dist {
  arch {
    layer_assign { name: "conv1", device: 0 }
    layer_assign { name: "conv2", device: 1 }
    layer_assign { name: "ip2", device: 0 }
  }
}
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = ingest_digits(tmp_path_factory.mktemp("split"))
    (root / "one.yaml").write_text(SOLVER)
    (root / "split.prototxt").write_text(SOLVER + DIST)  # `key: value` lines are prototxt too
    return root


def _args(work: Path, solver: str, out: str, *extra: str) -> list[str]:
    return train_args(work, out, solver, *extra)


def _close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rel: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        scale = max(np.abs(a[name]).max(), 1e-12)
        assert np.abs(a[name] - b[name]).max() / scale <= rel, name


@pytest.mark.slow
@pytest.mark.mpi
def test_two_logical_devices_train_the_weights_and_accuracy_of_one(work, run_ranks):
    # snapshots are named as Caffe names them without a snapshot_prefix: after the solver file (one_iter_30)
    run_ranks(1, _args(work, "one.yaml", "one", "--batch-per-rank", "64"), timeout=300)
    proc = run_ranks(1, _args(work, "split.prototxt", "split", "--batch-per-rank", "64"), timeout=300)
    assert "layers split over 2 devices: /device:CPU:0 -> /device:CPU:1 after pool1 (81,920 bytes)" in proc.stdout
    for k in (30, 60):
        _close(weights(work / "one" / "snapshots" / f"one_iter_{k}.solverstate"),
               weights(work / "split" / "snapshots" / f"split_iter_{k}.solverstate"), 1e-6)
    one = json.loads((work / "one" / "result.json").read_text())
    split = json.loads((work / "split" / "result.json").read_text())
    assert [e["top1"] for e in split["evals"]] == pytest.approx([e["top1"] for e in one["evals"]], abs=1e-9)
    assert one["evals"][-1]["top1"] > 0.8 and one["placement"] is None
    placement = split["placement"]
    assert placement["devices"] == ["/device:CPU:0"] * 2 + ["/device:CPU:1"] * 4 + ["/device:CPU:0"] * 2
    assert [(b["after"], b["bytes"]) for b in placement["boundaries"]] == [("pool1", 64 * 4 * 4 * 20 * 4),
                                                                         ("relu1", 64 * 500 * 4)]
    assert all(b["copy_s"] >= 0 for b in placement["boundaries"]) and placement["copy_s"] < 0.05
    # The model's iteration of the split (compute per device plus the copies) beside the measurement.
    shown = subprocess.run([sys.executable, "-m", "firescale", "predict", "split", "--record",
                            str(work / "split" / "result.json"), "--site", "local", "--baseline",
                            str(work / "one" / "result.json")], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    # Each boundary's activations go forward and their gradients back, at the site's memory bandwidth.
    bandwidth = load_site("local").device_memory_bandwidth
    pool1_ms, both_ms = 2 * 81_920 / bandwidth * 1e3, 2 * (81_920 + 64 * 500 * 4) / bandwidth * 1e3
    assert f"copy after pool1: 81,920 bytes forward and back, predicted {pool1_ms:.3f} ms, measured" in shown.stdout
    assert f"the split costs: predicted +{both_ms:.3f} ms per iteration, measured" in shown.stdout


@pytest.mark.slow
@pytest.mark.mpi
def test_replicas_of_a_split_net_combine_with_horovod(work, run_ranks):
    """Hybrid: 2 ranks, each a replica over 2 logical devices, at 32 each make the update of 1 x 64."""
    if not (work / "one" / "snapshots" / "one_iter_30.solverstate").exists():
        run_ranks(1, _args(work, "one.yaml", "one", "--batch-per-rank", "64"), timeout=300)
    run_ranks(2, _args(work, "split.prototxt", "hybrid", "--batch-per-rank", "32", "--set", "max_iter=30"),
              timeout=300)
    _close(weights(work / "one" / "snapshots" / "one_iter_30.solverstate"),
           weights(work / "hybrid" / "snapshots" / "split_iter_30.solverstate"), 1e-5)
    result = json.loads((work / "hybrid" / "result.json").read_text())
    assert result["ranks"] == 2 and len(result["placement"]["boundaries"]) == 2


PLACED = textwrap.dedent("""
    import sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from firescale.nets.zoo import get_net
    from firescale.train.tensorflow.nets import build_net
    from firescale.train.tensorflow.steps import loss_and_gradients
    spec = get_net("lenet_same")
    placement = ["/device:CPU:0"] * 2 + ["/device:CPU:1"] * 4 + ["/device:CPU:0"] * 2
    graph = tf.Graph()
    with graph.as_default():
        net = build_net(spec, 1, placement)
        x = tf.random.uniform((8, 28, 28, 1))
        loss, grads = tf.function(lambda a: loss_and_gradients(net, a, tf.zeros((8,), tf.int64),
                                                               tf.constant([1, 2], tf.int64)))(x)
        session = tf.compat.v1.Session()
        session.run([v.initializer for v in net.params])
        meta = tf.compat.v1.RunMetadata()
        session.run(grads, options=tf.compat.v1.RunOptions(trace_level=3), run_metadata=meta)
    for dev in meta.step_stats.dev_stats:
        for node in dev.node_stats:
            print(dev.device.rsplit(":", 1)[-1], node.node_name)
    print("variables", *[v.device.rsplit(":", 1)[-1] for v in net.params])
""")


def test_every_layer_and_its_gradient_run_on_the_layers_device():
    proc = subprocess.run([sys.executable, "-c", PLACED], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        device, node = line.split(" ", 1)
        if device != "variables":
            runs.setdefault(node, set()).add(device)
    variables = next(line for line in proc.stdout.splitlines() if line.startswith("variables")).split()[1:]
    assert variables == ["0", "0", "1", "1", "1", "1", "0", "0"]  # conv1, conv2, ip1, ip2: weights and bias

    def devices_of(fragment: str) -> set[str]:
        found = set().union(*[d for n, d in runs.items() if fragment in n])
        assert found, fragment
        return found

    assert devices_of("/conv1/") == {"0"} and devices_of("/conv2/") == {"1"} and devices_of("/ip1/") == {"1"}
    assert devices_of("gradients/conv2/") == {"1"} and devices_of("gradients/ip1/") == {"1"}
    assert devices_of("gradients/ip2/") == {"0"} and devices_of("gradients/conv1/") == {"0"}
    assert devices_of("DeepCopy") == {"0", "1"}  # the copy layer: forward onto 1, gradients back onto 0
