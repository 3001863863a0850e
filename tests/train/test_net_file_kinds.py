"""The trainer builds every kind a Caffe net file gives with Caffe's semantics, checked against NumPy written from
Caffe's layer code; what it cannot take (another class count, a learnt BatchNorm, phases that differ) is refused
in one sentence naming the file and layer."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from firescale.errors import FirescaleError
from firescale.nets.spec import BatchNorm, Branches, Conv, Flatten, NetSpec, Scale, Sigmoid, TanH, constant
from firescale.nets.zoo import get_net

NET_FILES = Path(__file__).parents[1] / "caffe" / "net_files"
TINY = NET_FILES / "tiny_resnet.prototxt"


def _conv_caffe(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pad: tuple[int, int],
                dilation: int) -> np.ndarray:
    """Caffe's im2col convolution, NCHW input and OIHW weights, in float64."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - (dilation * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dilation * (kw - 1) + 1)) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride[0]:i * stride[0] + dilation * (kh - 1) + 1:dilation,
                       j * stride[1]:j * stride[1] + dilation * (kw - 1) + 1:dilation]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out


def _net(layers, shape=(7, 6, 3), classes=None) -> NetSpec:
    from firescale.nets.spec import output_shape

    return NetSpec("t", shape, classes or output_shape("t", shape, tuple(layers))[2], tuple(layers))


def _nchw(y) -> np.ndarray:
    return np.asarray(y, np.float64).transpose(0, 3, 1, 2)


@pytest.mark.tensorflow
def test_rectangular_dilated_convolution_without_bias_is_caffes():
    from firescale.train.caffe_weights import caffe_layouts, to_caffe
    from firescale.train.tensorflow.nets import CaffeNet

    conv = Conv("c", 4, 3, stride=2, pad=1, kernel_w=2, stride_w=1, pad_w=2, dilation=2, bias=False,
                weight_init=constant(0.0))
    net = CaffeNet(_net([conv, Flatten("f")]), seed=1)
    assert [i.name for i in net.infos] == ["c/weights"]          # bias_term false: one blob
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 2, 3, 4)).astype(np.float32)
    net.param("c/weights").assign(w)
    x = rng.normal(size=(2, 7, 6, 3)).astype(np.float32)
    layout = caffe_layouts(net.spec)["c"][0]
    assert layout.caffe_shape == (4, 3, 3, 2)
    want = _conv_caffe(_nchw(x), to_caffe(layout, w).astype(np.float64), (2, 1), (1, 2), 2)
    # Flatten is Caffe's: C, H, W order
    got = net(x).numpy()
    np.testing.assert_allclose(got, want.reshape(2, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.tensorflow
def test_batch_norm_and_scale_are_caffes_in_train_and_test():
    from firescale.train.tensorflow.nets import CaffeNet

    spec = _net([BatchNorm("bn", eps=1e-3), Scale("sc", bias=True), Flatten("f")])
    net = CaffeNet(spec, seed=1, moving_average={"bn": 0.9})
    assert [i.name for i in net.infos] == ["bn/mean", "bn/variance", "bn/factor", "sc/scale", "sc/bias"]
    rng = np.random.default_rng(2)
    gamma, beta = rng.normal(size=3).astype(np.float32), rng.normal(size=3).astype(np.float32)
    net.param("sc/scale").assign(gamma)
    net.param("sc/bias").assign(beta)
    x = rng.normal(1.0, 2.0, size=(4, 7, 6, 3)).astype(np.float32)
    xs = x.astype(np.float64)
    mean, var = xs.mean(axis=(0, 1, 2)), xs.var(axis=(0, 1, 2))
    want = ((xs - mean) / np.sqrt(var + 1e-3) * gamma + beta).transpose(0, 3, 1, 2).reshape(4, -1)
    np.testing.assert_allclose(net(x, training=True).numpy(), want, rtol=1e-4, atol=1e-4)
    m = 4 * 7 * 6          # Caffe's moving sums: factor 1, the mean, the variance times m / (m - 1)
    np.testing.assert_allclose(net.param("bn/factor").numpy(), [1.0])
    np.testing.assert_allclose(net.param("bn/mean").numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(net.param("bn/variance").numpy(), var * m / (m - 1), rtol=1e-5)
    x2 = rng.normal(size=(4, 7, 6, 3)).astype(np.float32)
    net(x2, training=True)
    x2s = x2.astype(np.float64)
    factor = 0.9 * 1 + 1
    stored_mean = 0.9 * mean + x2s.mean(axis=(0, 1, 2))
    stored_var = 0.9 * var * m / (m - 1) + x2s.var(axis=(0, 1, 2)) * m / (m - 1)
    np.testing.assert_allclose(net.param("bn/factor").numpy(), [factor], rtol=1e-6)
    # the test phase (use_global_stats by default) normalises by the stored sums over the factor, and stores nothing
    test = ((xs - stored_mean / factor) / np.sqrt(stored_var / factor + 1e-3) * gamma + beta)
    np.testing.assert_allclose(net(x).numpy(), test.transpose(0, 3, 1, 2).reshape(4, -1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(net.param("bn/factor").numpy(), [factor], rtol=1e-6)
    # use_global_stats: true normalises by the stored statistics in training too, and keeps them
    fixed = CaffeNet(replace(spec, layers=(BatchNorm("bn", use_global_stats=True), *spec.layers[1:])), seed=1)
    # no updates yet (factor 0): Caffe scales the stored sums by 0, so x / sqrt(eps); Scale starts at 1 and 0
    want = (xs / np.sqrt(1e-5)).transpose(0, 3, 1, 2).reshape(4, -1)
    np.testing.assert_allclose(fixed(x, training=True).numpy(), want, rtol=1e-4)
    assert fixed.param("bn/factor").numpy()[0] == 0.0


@pytest.mark.tensorflow
def test_lrn_within_channel_is_caffes_and_cifar10_full_builds():
    from firescale.nets.spec import LRN
    from firescale.train.tensorflow.nets import CaffeNet

    net = CaffeNet(_net([LRN("n", local_size=3, alpha=0.3, beta=0.75, within_channel=True), Flatten("f")]), seed=1)
    x = np.random.default_rng(5).normal(size=(2, 7, 6, 3)).astype(np.float32)
    xs = _nchw(x)
    padded = np.pad(xs ** 2, ((0, 0), (0, 0), (1, 1), (1, 1)))
    # Caffe's split, power 2, AVE pooling (size 3, pad 1: the window always counts 9 cells), power -beta, product
    mean = sum(padded[:, :, i:i + 7, j:j + 6] for i in range(3) for j in range(3)) / 9
    want = xs * (1 + 0.3 * mean) ** -0.75
    np.testing.assert_allclose(net(x).numpy(), want.reshape(2, -1), rtol=1e-5, atol=1e-6)
    full = CaffeNet(get_net("cifar10_full", input_shape=(8, 8, 1)), seed=1)
    assert tuple(full(np.ones((2, 8, 8, 1), np.float32), training=True).shape) == (2, 10)


@pytest.mark.tensorflow
@pytest.mark.parametrize("merge, combine", [("sum", np.add), ("prod", np.multiply), ("max", np.maximum)])
def test_eltwise_merges_with_an_identity_shortcut(merge, combine):
    from firescale.train.tensorflow.nets import CaffeNet

    block = Branches("res", ((), (Sigmoid("s"),), (TanH("t"),)), merge)
    net = CaffeNet(_net([block, Flatten("f")]), seed=1)
    x = np.random.default_rng(3).normal(size=(2, 7, 6, 3)).astype(np.float32)
    xs = x.astype(np.float64)
    want = combine(combine(xs, 1 / (1 + np.exp(-xs))), np.tanh(xs))
    np.testing.assert_allclose(net(x).numpy(), want.transpose(0, 3, 1, 2).reshape(2, -1), rtol=1e-5, atol=1e-6)


@pytest.mark.tensorflow
def test_a_residual_net_file_trains_and_its_blobs_round_trip_in_caffes_shapes(tmp_path):
    import tensorflow as tf

    from firescale.train.caffe_weights import net_from_caffe, net_to_caffe
    from firescale.train.net_file import net_file_settings
    from firescale.train.tensorflow.nets import CaffeNet
    from firescale.train.tensorflow.steps import loss_and_gradients

    spec = get_net(str(TINY), input_shape=(8, 8, 1))
    settings = net_file_settings(spec)
    assert settings is not None and settings.moving_average == {"bn1": 0.999, "res/bn_a": 0.9}
    net = CaffeNet(spec, seed=5, moving_average=settings.moving_average)
    weights = {i.name: p.numpy() for i, p in zip(net.infos, net.params)}
    blobs = net_to_caffe(spec, weights)
    assert {k: [a.shape for a in v] for k, v in blobs.items()} == {
        "conv1": [(8, 1, 3, 3)], "bn1": [(8,), (8,), (1,)], "scale1": [(8,), (8,)], "res_a": [(8, 8, 3, 1)],
        "bn_a": [(8,), (8,), (1,)], "scale_a": [(8,), (8,)], "res_b": [(8, 8, 3, 3), (8,)], "ip": [(10, 128), (10,)]}
    back = net_from_caffe(spec, blobs, "here")
    assert back.kept == [] and back.ignored == [] and all(np.array_equal(back.weights[k], weights[k]) for k in weights)
    # through Caffe's files, binary and HDF5: every blob exactly
    from firescale.caffe.caffemodel import read_weights, write_caffemodel, write_caffemodel_h5
    from firescale.train.caffe_weights import layer_types

    assert layer_types(spec)["bn_a"] == "BatchNorm" and layer_types(spec)["scale1"] == "Scale"
    for path in (write_caffemodel(tmp_path / "t.caffemodel", blobs, spec.name, layer_types(spec)),
                 write_caffemodel_h5(tmp_path / "t.caffemodel.h5", blobs)):
        again = net_from_caffe(spec, read_weights(path), path)
        assert all(np.array_equal(again.weights[k], weights[k]) for k in weights), path
    x = np.random.default_rng(1).normal(size=(6, 8, 8, 1)).astype(np.float32)
    loss, grads = loss_and_gradients(net, tf.constant(x), tf.constant(np.arange(6) % 10), tf.constant([1, 2], tf.int64))
    by_name = {i.name: g.numpy() for i, g in zip(net.infos, grads)}
    assert np.isfinite(float(loss)) and not np.any(by_name["bn1/mean"]) and np.any(by_name["conv1/weights"])
    assert np.any(by_name["res/scale_a/bias"]) and net.param("res/bn_a/factor").numpy()[0] == 1.0


@pytest.mark.tensorflow
def test_lr_and_decay_mults_come_from_the_net_file_and_the_solver_tables_win():
    from firescale.caffe.solver import SolverConfig
    from firescale.train.net_file import blob_multipliers, net_file_settings
    from firescale.train.tensorflow.nets import CaffeNet

    spec = get_net(str(TINY), input_shape=(8, 8, 1))
    net = CaffeNet(spec, seed=1)
    settings = net_file_settings(spec)
    lrs, decays = blob_multipliers(spec, net.infos, settings, SolverConfig(), Path("s.prototxt"))
    got = {i.name: (lr, d) for i, lr, d in zip(net.infos, lrs, decays)}
    assert got["res/res_b/bias"] == (2.0, 0.0) and got["res/res_b/weights"] == (1.0, 1.0)
    assert got["res/bn_a/mean"][0] == got["bn1/factor"][0] == 0.0 and got["ip/bias"] == (2.0, 1.0)
    table = SolverConfig(lr_mult={"ip": [0.0, 0.5]})
    lrs, _ = blob_multipliers(spec, net.infos, settings, table, Path("s.prototxt"))
    assert dict(zip((i.name for i in net.infos), lrs))["ip/bias"] == 0.5
    # a V1 file's blobs_lr: the same as a param { lr_mult } block
    v1 = get_net(str(NET_FILES / "lenet_v1.prototxt"), input_shape=(28, 28, 1))
    assert blob_multipliers(v1, CaffeNet(v1, seed=1).infos, net_file_settings(v1), SolverConfig(),
                            Path("s")) == ([1.0, 2.0] * 4, [1.0] * 8)
    # a built-in net: 1 and 1 on every blob (as before net files), unless the solver's tables say otherwise
    lenet = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    built_in = CaffeNet(lenet, seed=1)
    assert blob_multipliers(lenet, built_in.infos, None, SolverConfig(), Path("s")) == ([1.0] * 8, [1.0] * 8)


@pytest.mark.tensorflow
def test_one_sgd_step_applies_lr_mult_2_to_the_biases_of_cifar10_quick():
    import tensorflow as tf

    from firescale.caffe.solver import SolverConfig
    from firescale.train.net_file import blob_multipliers, net_file_settings
    from firescale.train.tensorflow.nets import CaffeNet
    from firescale.train.tensorflow.solvers import CaffeSolver
    from firescale.train.tensorflow.steps import apply_update, loss_and_gradients

    spec = get_net("cifar10_quick", input_shape=(8, 8, 1))
    net = CaffeNet(spec, seed=2)
    cfg = SolverConfig(base_lr=0.1, max_iter=1, momentum=0.9, weight_decay=0.01)
    lrs, decays = blob_multipliers(spec, net.infos, net_file_settings(spec), cfg, Path("s"))
    solver = CaffeSolver(cfg, net.params, [i.name for i in net.infos], lrs, decays)
    before = [p.numpy().astype(np.float64) for p in net.params]
    x = np.random.default_rng(4).normal(size=(4, 8, 8, 1)).astype(np.float32)
    labels = tf.constant([0, 3, 5, 9], tf.int64)
    _, grads = loss_and_gradients(net, tf.constant(x), labels, tf.constant([1, 2], tf.int64))
    apply_update(solver, list(grads), tf.constant(0.1), tf.constant(0, tf.int64), 4.0)
    for info, w0, g, w1 in zip(net.infos, before, grads, net.params):
        lr_mult = 2.0 if info.blob == "bias" else 1.0     # cifar10_quick's param { lr_mult: 2 } on biases
        # Caffe's SGD from zero history: w - local_rate * (g / batch + local_decay * w)
        want = w0 - 0.1 * lr_mult * (g.numpy().astype(np.float64) / 4 + 0.01 * w0)
        np.testing.assert_allclose(w1.numpy(), want, rtol=1e-5, atol=1e-8, err_msg=info.name)
    assert np.any(grads[1].numpy())      # conv1's bias moved, at twice the rate


@pytest.mark.tensorflow
def test_what_the_trainer_cannot_build_or_take_is_refused_naming_it(tmp_path):
    from firescale.caffe.solver import SolverConfig
    from firescale.train.net_file import blob_multipliers, check_classes, net_file_settings
    from firescale.train.tensorflow.nets import CaffeNet

    quick = get_net("cifar10_quick", input_shape=(8, 8, 1))
    with pytest.raises(FirescaleError, match=r"cifar10_quick_train_test.prototxt: its last InnerProduct 'ip2' gives 10 "
                                             r"outputs, but dataset DATA/x has 100 classes; expected them to agree"):
        check_classes(quick, 100, Path("DATA/x"))
    text = TINY.read_text().replace('name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1"\n'
                                    '        param { lr_mult: 0 }', 'name: "bn1" type: "BatchNorm" bottom: "conv1" '
                                    'top: "conv1"\n        param { lr_mult: 1 }')
    assert text != TINY.read_text()
    learnt = tmp_path / "bn_learnt.prototxt"
    learnt.write_text(text)
    spec = get_net(str(learnt), input_shape=(8, 8, 1))
    with pytest.raises(FirescaleError, match=r"bn_learnt.prototxt: layer 'bn1' \(BatchNorm\) gives its blob 0 "
                                             r"lr_mult 1.0; Caffe refuses"):
        blob_multipliers(spec, CaffeNet(spec, seed=1).infos, net_file_settings(spec), SolverConfig(), Path("s"))
    other = tmp_path / "phases.prototxt"
    other.write_text(TINY.read_text().replace(
        'layer { name: "gate" type: "Sigmoid" bottom: "res" top: "gate" }',
        'layer { name: "gate" type: "Sigmoid" bottom: "res" top: "gate" include { phase: TRAIN } }\n'
        'layer { name: "gate" type: "TanH" bottom: "res" top: "gate" include { phase: TEST } }'))
    with pytest.raises(FirescaleError, match=r"phases.prototxt: the TEST phase's net differs from the TRAIN "
                                             r"phase's at layer 'gate'"):
        net_file_settings(get_net(str(other), input_shape=(8, 8, 1)))


def test_the_net_comes_from_net_or_the_solvers_net_line(tmp_path):
    from firescale.caffe.solver import load_solver
    from firescale.train.net_file import choose_net

    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "mine.prototxt").write_text(TINY.read_text())
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "nets/mine.prototxt"\nbase_lr: 0.01\nmax_iter: 3\n')
    cfg = load_solver(solver)
    chosen = choose_net(None, cfg, solver)
    assert chosen.name == str(tmp_path / "nets" / "mine.prototxt") and "the solver's net:" in chosen.note
    wins = choose_net("lenet", cfg, solver)
    assert wins.name == "lenet" and wins.note == ("--net lenet is trained; the solver's net: 'nets/mine.prototxt' "
                                                  "is set aside")
    solver.write_text('net: "nets/missing.prototxt"\nbase_lr: 0.01\nmax_iter: 3\n')
    with pytest.raises(FirescaleError, match=r"solver.prototxt: net: 'nets/missing.prototxt' names no file"):
        choose_net(None, load_solver(solver), solver)
    solver.write_text("base_lr: 0.01\nmax_iter: 3\n")
    with pytest.raises(FirescaleError, match=r"no --net and no net: line in the solver"):
        choose_net(None, load_solver(solver), solver)


@pytest.mark.tensorflow
def test_a_caffe_file_of_known_kinds_builds_as_the_python_net():
    from firescale.train.tensorflow.nets import CaffeNet

    quick = CaffeNet(get_net("cifar10_quick"), seed=3)
    assert [info.name for info in quick.infos][:2] == ["conv1/weights", "conv1/bias"]
    assert sum(int(np.prod(info.shape)) for info in quick.infos) == 145_578
    logits = quick(np.zeros((2, 32, 32, 3), np.float32))
    assert tuple(logits.shape) == (2, 10)


def test_the_zoos_resnet50_and_googlenet_keep_caffes_layer_names_for_their_blobs():
    from firescale.caffe.net import read_net
    from firescale.train.caffe_weights import caffe_layouts

    googlenet = Path(__file__).parents[2] / "src/firescale/nets/caffe_zoo/bvlc_googlenet/train_val.prototxt"
    found = {}
    for spec, kinds in ((get_net("resnet50"), ("Convolution", "InnerProduct", "BatchNorm", "Scale")),
                        (get_net(str(googlenet)), ("Convolution", "InnerProduct"))):
        found[spec.name] = layouts = caffe_layouts(spec)
        in_file = {layer.name for layer in read_net(spec.source).layers if layer.type in kinds}
        heads = {n for n in in_file if n.startswith(("loss1/", "loss2/"))}    # the auxiliary classifiers, left out
        assert set(layouts) == in_file - heads, spec.name
    resnet = found["resnet50"]
    assert [b.param for b in resnet["res2a_branch1"]] == ["res2a/res2a_branch1/weights"]
    assert [b.caffe_shape for b in resnet["bn2a_branch1"]] == [(256,), (256,), (1,)]
    sizes = {stored: sum(int(np.prod(b.caffe_shape)) for blobs in resnet.values() for b in blobs
                         if (b.blob in ("mean", "variance", "factor")) == stored) for stored in (False, True)}
    assert sizes == {False: 25_557_096, True: 53_173}        # learnt and stored, as docs/nets.md gives them
