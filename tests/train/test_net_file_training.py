"""`firescale train` of Caffe net files as real MPI ranks on digits: Caffe's cifar10_quick through a solver's net:
line and a residual net with BatchNorm, Scale and Eltwise; N x b == 1 x N*b (with BatchNorm: 1 x b x iter_size
N), same seed same bits, lr_mult 0 freezes a layer, an edited net file is not resumed."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ingest_digits, weights

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.tensorflow]

TINY = Path(__file__).parents[1] / "caffe" / "net_files" / "tiny_resnet.prototxt"
SOLVER = """\
net: "{net}"
type: SGD
base_lr: 0.05
momentum: 0.9
weight_decay: 0.0005
lr_policy: fixed
max_iter: 10
snapshot: 5
snapshot_prefix: snapshot
test_interval: 10
test_initialization: false
random_seed: 7
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    from firescale.nets.zoo import CAFFE_NETS
    from firescale.resources import caffe_zoo_file

    root = ingest_digits(tmp_path_factory.mktemp("netfile"))
    (root / "nets").mkdir()
    with caffe_zoo_file(CAFFE_NETS["cifar10_quick"][0]).open("rb") as fh:   # Caffe's file, verbatim
        (root / "nets" / "cifar10_quick_train_test.prototxt").write_bytes(fh.read())
    shutil.copy(TINY, root / "nets" / "tiny_resnet.prototxt")
    for net in ("cifar10_quick_train_test", "tiny_resnet"):
        (root / f"{net}_solver.prototxt").write_text(SOLVER.format(net=f"nets/{net}.prototxt"))
    return root


def _train(work: Path, solver: str, out: str, *extra: str) -> list[str]:
    """`firescale train` with the net from the solver's net: line (relative to the solver file), the pixels scaled
    by 1/255 and no mean (cifar10_quick's mean_file is Caffe's, not here)."""
    return ["train", "--dataset", str(work / "digits"), "--solver", str(work / solver), "--out", str(work / out),
            "--scale", repr(1 / 255), "--mean", "0", *extra]


def _snap(work: Path, out: str, k: int) -> dict[str, np.ndarray]:
    return weights(work / out / "snapshots" / f"snapshot_iter_{k}.solverstate")


def _close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], names: list[str]) -> None:
    for name in names:
        scale = max(np.abs(a[name]).max(), 1e-12)
        assert np.abs(a[name] - b[name]).max() / scale < 1e-5, name


def test_cifar10_quick_from_the_solvers_net_line_two_ranks_equal_one_with_twice_the_batch(work, run_ranks):
    two = run_ranks(2, _train(work, "cifar10_quick_train_test_solver.prototxt", "q2", "--batch-per-rank", "8"))
    assert "the solver's net: 'nets/cifar10_quick_train_test.prototxt' is trained" in two.stdout
    assert "the TRAIN data layer 'cifar' (Data) reads --dataset's train split" in two.stdout
    run_ranks(1, _train(work, "cifar10_quick_train_test_solver.prototxt", "q1", "--batch-per-rank", "16"))
    start = _snap(work, "q2", 5)
    for k in (5, 10):
        a, b = _snap(work, "q2", k), _snap(work, "q1", k)
        _close(a, b, [n for n in a if n.startswith("weights/")])
    end = _snap(work, "q2", 10)
    assert any(not np.array_equal(end[n], start[n]) for n in end)   # it trained between 5 and 10
    assert [w.shape for w in (end["weights/conv1/0"], end["weights/conv1/1"], end["weights/ip2/0"])] == \
        [(32, 1, 5, 5), (32,), (10, 64)]


def test_a_residual_net_with_batch_norm_two_ranks_equal_one_rank_with_iter_size_2(work, run_ranks):
    # BatchNorm normalises by each rank's own batch, as Caffe's multi-GPU training does: two ranks of b are one
    # rank accumulating two batches of b (iter_size 2), not one batch of 2b
    run_ranks(2, _train(work, "tiny_resnet_solver.prototxt", "r2", "--batch-per-rank", "8"))
    run_ranks(1, _train(work, "tiny_resnet_solver.prototxt", "r1", "--batch-per-rank", "8", "--set", "iter_size=2"))
    # the same seed and ranks again, every iteration in parts (gradients, allreduce, update): the same bits
    run_ranks(2, _train(work, "tiny_resnet_solver.prototxt", "r2b", "--batch-per-rank", "8", "--split-every", "1"))
    from firescale.caffe.caffemodel import read_weights

    blobs = read_weights(work / "r2" / "snapshots" / "snapshot_iter_10.caffemodel")
    statistics = {f"weights/{layer}/{i}" for layer in ("bn1", "bn_a") for i in range(3)}
    assert {layer: len(b) for layer, b in blobs.items()} == {"conv1": 1, "bn1": 3, "scale1": 2, "res_a": 1,
                                                            "bn_a": 3, "scale_a": 2, "res_b": 2, "ip": 2}
    for k in (5, 10):
        a, b, c = _snap(work, "r2", k), _snap(work, "r1", k), _snap(work, "r2b", k)
        _close(a, b, [n for n in a if n.startswith("weights/") and n not in statistics])
        assert a.keys() == c.keys() and all(np.array_equal(a[n], c[n]) for n in a)
    # rank 0's statistics: 10 updates of one batch each, the factor counting them with moving_average_fraction
    assert np.isclose(blobs["bn_a"][2][0], sum(0.9 ** i for i in range(10)), rtol=1e-6)
    assert np.isclose(blobs["bn1"][2][0], sum(0.999 ** i for i in range(10)), rtol=1e-6)
    assert np.all(blobs["bn1"][1] > 0)
    # the statistics' gradients (zero) are not sent: the allreduce carries the model's |W|
    import json

    from firescale.model.layers import net_cost
    from firescale.nets.zoo import get_net

    allreduce = json.loads((work / "r2" / "result.json").read_text())["allreduce"]
    if allreduce["cpu_operations"] == "mpi":     # no setting: the message is resolved for the gradient
        weight_bytes = net_cost(get_net(str(TINY), input_shape=(8, 8, 1)), 1).weight_bytes
        assert allreduce["message_bytes"] == weight_bytes == 8680


def test_lr_mult_0_freezes_a_layer_and_an_edited_net_file_is_not_resumed(work, run_ranks):
    from firescale.nets.zoo import get_net
    from firescale.train.caffe_weights import caffe_layouts, to_caffe
    from firescale.train.tensorflow.nets import CaffeNet

    frozen = work / "nets" / "frozen.prototxt"
    text = TINY.read_text().replace("param { lr_mult: 1 decay_mult: 1 }", "param { lr_mult: 0 decay_mult: 1 }")
    frozen.write_text(text.replace("param { lr_mult: 1 } param { lr_mult: 2 }\n        inner_product_param",
                                   "param { lr_mult: 0 } param { lr_mult: 0 }\n        inner_product_param"))
    proc = run_ranks(1, _train(work, "tiny_resnet_solver.prototxt", "f1", "--net", str(frozen),
                               "--batch-per-rank", "8"))
    assert "--net " + str(frozen) + " is trained; the solver's net: 'nets/tiny_resnet.prototxt' is set aside" \
        in proc.stdout
    spec = get_net(str(frozen), input_shape=(8, 8, 1))
    start = CaffeNet(spec, seed=7)     # the solver's random_seed: the same fillers
    layouts = caffe_layouts(spec)
    end = _snap(work, "f1", 10)
    for layer in ("conv1", "ip"):
        for layout in layouts[layer]:
            first = to_caffe(layout, start.param(layout.param).numpy())
            assert np.array_equal(end[f"weights/{layer}/{layout.index}"], first), (layer, layout.index)
    assert not np.array_equal(end["weights/res_b/0"], to_caffe(layouts["res_b"][0],
                                                                start.param("res/res_b/weights").numpy()))
    # resuming after the net file changed is refused, naming its hash
    frozen.write_text(frozen.read_text() + "# edited\n")
    failed = run_ranks(1, _train(work, "tiny_resnet_solver.prototxt", "f1", "--net", str(frozen), "--batch-per-rank",
                                 "8", "--snapshot", str(work / "f1" / "snapshots" / "snapshot_iter_5.solverstate")),
                       check=False)
    assert failed.returncode != 0 and "was written with other settings (net_sha256 " in failed.stdout + failed.stderr
