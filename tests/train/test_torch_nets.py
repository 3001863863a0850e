"""The PyTorch backend builds every layer kind as the TensorFlow backend does: from one seed the same blobs, and
for the same images (NCHW here, NHWC there) the same logits in training and test, the same summed loss, the same
gradients (in the trainer's layout) and the same BatchNorm blobs after training's forward pass.

Agreement is checked at rtol 1e-4 with an absolute floor of 1e-5 of the compared array's largest value (float32
on a CPU; the two backends sum in other orders and use other convolution kernels).  The worst error measured over
these cases, relative to the array's largest value: logits 1.0e-6 (LeNet), BatchNorm's blobs 2.8e-7, the loss
7.8e-7, gradients 1.8e-6 (the BatchNorm and merges net); the initial blobs are bitwise equal.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from firescale.errors import FirescaleError
from firescale.nets.spec import (
    FC,
    LRN,
    BatchNorm,
    Branches,
    Conv,
    Dropout,
    Flatten,
    NetSpec,
    Pool,
    ReLU,
    Scale,
    Sigmoid,
    Softmax,
    TanH,
    constant,
    gaussian,
    infer_shapes,
    pool_extra_padding,
)
from firescale.nets.zoo import get_net
from firescale.train.torch.nets import CaffeNet, from_trainer_layout, to_trainer_layout
from firescale.train.torch.steps import eval_sums, loss_and_gradients, topk_correct

pytestmark = pytest.mark.pytorch

RTOL, ATOL = 1e-4, 1e-5     # ATOL: a fraction of the compared array's largest magnitude
G = gaussian(0.3)

# Convolutions of every shape, padded and overhanging pools of both modes, LRN both ways, the squashing layers,
# Flatten (over 3x2 cells, so that its C, H, W order matters) and InnerProduct.
KINDS = NetSpec("kinds", (16, 13, 3), 10, (
    Conv("rect", 6, 3, stride=2, pad=1, kernel_w=5, stride_w=1, pad_w=2, weight_init=G, bias_init=gaussian(0.1)),
    ReLU("relu1"),
    Pool("maxpad", "max", kernel=3, stride=2, pad=1),
    LRN("across", local_size=3, alpha=1.0, beta=0.75, k=2.0),
    Conv("grouped", 8, 2, pad=1, groups=2, weight_init=G, bias_init=gaussian(0.1)),
    TanH("tanh"),
    Pool("avgpad", "avg", kernel=3, stride=2, pad=1),
    LRN("within", local_size=3, alpha=2.0, beta=0.75, within_channel=True),
    Conv("dilated", 6, 3, stride=2, pad=2, dilation=2, weight_init=G, bias_init=gaussian(0.1)),
    Sigmoid("sigmoid"),
    Flatten("flat"),
    FC("fc1", 16, weight_init=G, bias_init=gaussian(0.1)),
    ReLU("relu2"),
    FC("fc2", 10, weight_init=G),
    Softmax(),
))

# BatchNorm (batch statistics in training) with Scale, residual sum, product and three-way max merges, an
# inception-like concat, a floor-rounded pool and both global pools.
BLOCKS = NetSpec("blocks", (11, 9, 3), 10, (
    Conv("c1", 8, 3, pad=1, bias=False, weight_init=G),
    BatchNorm("bn1"), Scale("sc1", bias=True), ReLU("r1"),
    Branches("res", ((), (Conv("a", 8, 3, pad=1, bias=False, weight_init=G), BatchNorm("bn"), Scale("s"))), "sum"),
    Branches("prod", ((Conv("p1", 8, 1, weight_init=G),), (Conv("p2", 8, 1, weight_init=G), Sigmoid("sg"))), "prod"),
    Branches("max", ((Conv("m1", 8, 3, pad=1, weight_init=G),), (Conv("m2", 8, 3, pad=1, weight_init=G),),
                     (Conv("m3", 8, 1, weight_init=G),)), "max"),
    Branches("cat", ((Conv("k1", 4, 1, weight_init=G),), (Pool("mp", "max", 3, 1, pad=1),),
                     (Conv("k3", 4, 3, pad=1, weight_init=G), ReLU("kr"))), "concat"),
    Pool("floor", "avg", kernel=2, stride=2, rounding="floor"),
    Branches("heads", ((Pool("gmax", "max", global_pool=True),), (Pool("gavg", "avg", global_pool=True),)), "concat"),
    FC("fc", 10, weight_init=G, bias_init=gaussian(0.1)),
    Softmax(),
))


def _no_dropout(spec: NetSpec) -> NetSpec:
    """`spec` with every dropout rate 0: the backends draw their masks from other generators, so a training pass
    is compared without masks."""
    return replace(spec, layers=tuple(replace(layer, rate=0.0) if isinstance(layer, Dropout) else layer
                                      for layer in spec.layers))


def _close(got: np.ndarray, want: np.ndarray, what: str) -> float:
    """Assert agreement at RTOL, ATOL x the largest |want|; returns the error relative to that largest value."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    scale = float(np.abs(want).max()) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * scale, err_msg=what)
    return float(np.abs(got - want).max() / scale) if scale else 0.0


@dataclass
class Pair:
    """The same net in both backends, and images for both."""

    torch_net: CaffeNet
    tf_net: object
    images: np.ndarray      # NCHW float32
    labels: np.ndarray

    @property
    def nhwc(self) -> np.ndarray:
        return np.ascontiguousarray(self.images.transpose(0, 2, 3, 1))


def _pair(spec: NetSpec, seed: int = 4, batch: int = 3, moving_average: dict[str, float] | None = None,
          random_blobs: tuple[str, ...] = ()) -> Pair:
    """Both nets of `spec` from `seed`, their blobs checked bitwise equal; the blobs of layer kinds in
    `random_blobs` (e.g. 'scale', 'weights') then set to the same random values in both."""
    from firescale.train.tensorflow.nets import build_net

    torch_net = CaffeNet(spec, seed, moving_average)
    tf_net = build_net(spec, seed, moving_average=moving_average)
    assert [i.name for i in torch_net.infos] == [i.name for i in tf_net.infos]
    assert [i.shape for i in torch_net.infos] == [i.shape for i in tf_net.infos]
    read = torch_net.read_params()
    for info, var in zip(tf_net.infos, tf_net.params):
        assert read[info.name].dtype == np.float32
        assert np.array_equal(read[info.name], var.numpy()), info.name   # bitwise: one generator, one order
    rng = np.random.default_rng(seed + 1)
    new = {i.name: rng.normal(0.0, 0.3, i.shape).astype(np.float32) for i in torch_net.infos
           if i.blob in random_blobs}
    torch_net.write_params(new)
    for info, var in zip(tf_net.infos, tf_net.params):
        if info.name in new:
            var.assign(new[info.name])
    h, w, c = spec.input_shape
    images = rng.normal(size=(batch, c, h, w)).astype(np.float32)
    labels = rng.integers(0, spec.num_classes, size=batch)
    return Pair(torch_net, tf_net, images, labels)


def _same_statistics(pair: Pair, what: str) -> list[float]:
    read = pair.torch_net.read_params()
    return [_close(read[i.name], v.numpy(), f"{what}: {i.name}")
            for i, v, learnt in zip(pair.tf_net.infos, pair.tf_net.params, pair.tf_net.learnt) if not learnt]


def _agree(pair: Pair, train: bool = True) -> dict[str, float]:
    """Logits in training (with BatchNorm's blobs after it) and test, loss and gradients agree; the worst errors."""
    import tensorflow as tf

    from firescale.train.tensorflow.steps import loss_and_gradients as tf_loss_and_gradients

    x = torch.from_numpy(pair.images)
    errors: dict[str, list[float]] = {"logits": [], "statistics": [], "loss": [], "gradients": []}
    if train:
        got = pair.torch_net(x, training=True).detach().numpy()
        errors["logits"].append(_close(got, pair.tf_net(pair.nhwc, training=True).numpy(), "training logits"))
        errors["statistics"] += _same_statistics(pair, "after a training forward")
    got = pair.torch_net(x, training=False).detach().numpy()
    errors["logits"].append(_close(got, pair.tf_net(pair.nhwc, training=False).numpy(), "test logits"))
    if train:
        loss, grads = loss_and_gradients(pair.torch_net, x, torch.from_numpy(pair.labels))
        tf_loss, tf_grads = tf_loss_and_gradients(pair.tf_net, tf.constant(pair.nhwc), tf.constant(pair.labels),
                                                  tf.constant([0, 0], tf.int64))
        assert loss.shape == () and loss.dtype == torch.float32
        errors["loss"].append(_close(loss.numpy(), tf_loss.numpy(), "loss"))
        assert len(grads) == len(pair.torch_net.params)
        for info, g, want, learnt in zip(pair.torch_net.infos, grads, tf_grads, pair.torch_net.learnt):
            got = to_trainer_layout(pair.torch_net, info.name, g.numpy())
            if not learnt:   # Caffe's BatchNorm gives its blobs no diff, in either backend
                assert not got.any() and not np.asarray(want).any(), f"{info.name}: statistics get a zero gradient"
                continue
            errors["gradients"].append(_close(got, np.asarray(want), f"gradient of {info.name}"))
        errors["statistics"] += _same_statistics(pair, "after loss_and_gradients")
    return {k: max(v) for k, v in errors.items() if v}


# ------------------------------------------------------------ every layer kind
@pytest.mark.tensorflow
def test_every_layer_kind_agrees_with_tensorflow():
    """Rectangular, grouped and dilated-strided convolutions, padded ceil-mode max and average pools that
    overhang the input, LRN across and within channels, ReLU, TanH, Sigmoid, Flatten, InnerProduct."""
    shapes = {rec.name: rec for rec in infer_shapes(KINDS)}
    for name in ("maxpad", "avgpad"):    # the pools do overhang: Caffe's clipped divisor and -inf padding matter
        rec = shapes[name]
        assert max(pool_extra_padding(rec.input_shape[0], rec.layer), pool_extra_padding(rec.input_shape[1], rec.layer))
    assert shapes["flat"].input_shape[:2] != (1, 1)
    errors = _agree(_pair(KINDS))
    assert errors["loss"] < RTOL


@pytest.mark.tensorflow
def test_batch_norm_scale_and_every_merge_agree_with_tensorflow():
    """BatchNorm in training (its moving sums, a moving_average_fraction of 0.9 given for one layer) and test,
    Scale with random factors and offsets, Eltwise sum (an identity shortcut), prod and max, a concat, a
    floor-rounded pool and global max and average pools; two training passes update the statistics twice."""
    pair = _pair(BLOCKS, moving_average={"bn1": 0.9}, random_blobs=("scale", "bias"))
    _agree(pair, train=False)     # stored statistics still zero, factor 0: Caffe's scale 0, x / sqrt(eps)
    _agree(pair)
    read = pair.torch_net.read_params()
    assert read["bn1/factor"][0] == np.float32(np.float32(0.9) + 1.0)    # 0 -> 1 -> 0.9 * 1 + 1
    assert read["res/bn/factor"][0] == np.float32(np.float32(0.999) + 1.0)
    assert read["bn1/mean"].any() and read["bn1/variance"].min() > 0


@pytest.mark.tensorflow
@pytest.mark.parametrize(("name", "shape"), [("lenet", (28, 28, 1)), ("cifar10_quick", (32, 32, 3)),
                                             ("cifar10_full", (32, 32, 3)), ("lenet_same", (16, 16, 1)),
                                             ("nin", (64, 64, 3))])
def test_zoo_nets_agree_with_tensorflow(name, shape):
    """Caffe's LeNet, CIFAR-10 quick and full (LRN within channel) files as written, and the built-in nets
    (NiN's dropout at rate 0 in training, since the backends draw other masks; in test it is the identity)."""
    spec = get_net(name, num_classes=10, input_shape=shape)
    if any(isinstance(layer, Dropout) for layer in spec.layers):
        _agree(_pair(spec, batch=2), train=False)
        spec = _no_dropout(spec)
    _agree(_pair(spec, batch=2))


def _resnet_stage() -> NetSpec:
    """Caffe's ResNet-50 deploy file as written, up to its first stage (conv1 to res2c: convolutions without bias,
    BatchNorm on stored statistics, Scale, identity and projection shortcuts), then a global pool and a 10-way
    InnerProduct, at 40x40: the whole net needs 197x197 inputs for its 7x7 pool5."""
    spec = get_net("resnet50", num_classes=10, input_shape=(224, 224, 3))
    end = [layer.name for layer in spec.layers].index("res2c_relu")
    head = (Pool("pool5", "avg", global_pool=True), FC("fc1000", 10, weight_init=G), Softmax("prob"))
    return replace(spec, input_shape=(40, 40, 3), layers=spec.layers[:end + 1] + head)


@pytest.mark.tensorflow
def test_resnet50s_first_stage_from_caffes_file_agrees_with_tensorflow():
    spec = _resnet_stage()
    kinds = {type(rec.layer).__name__ for rec in infer_shapes(spec)}
    assert {"BatchNorm", "Scale", "Branches", "Conv"} <= kinds
    assert any(isinstance(layer, Branches) and layer.merge == "sum" for layer in spec.layers)
    # The deploy file gives no fillers (zero weights) and stored statistics: random blobs, positive variances.
    pair = _pair(spec, batch=2, random_blobs=("weights", "bias", "scale", "mean"))
    arrays = {i.name: np.full(i.shape, 1.5 if i.blob == "variance" else 1.0, np.float32)
              for i in pair.torch_net.infos if i.blob in ("variance", "factor")}
    pair.torch_net.write_params(arrays)
    for info, var in zip(pair.tf_net.infos, pair.tf_net.params):
        if info.name in arrays:
            var.assign(arrays[info.name])
    _agree(pair)
    assert pair.torch_net.read_params()["bn_conv1/factor"][0] == 1.0   # use_global_stats: never updated


def test_a_tie_of_eltwise_max_goes_to_the_first_bottom_as_caffes_mask():
    """Two branches of equal weights tie everywhere: Caffe's EltwiseLayer (and TensorFlow's maximum) gives the
    whole gradient to the first; torch.maximum would give each half."""
    same = constant(0.5)
    spec = NetSpec("tie", (3, 3, 2), 4, (Branches("max", ((Conv("a", 3, 1, weight_init=same),),
                                                          (Conv("b", 3, 1, weight_init=same),)), "max"),
                                         FC("ip", 4, weight_init=G), Softmax()))
    net = CaffeNet(spec, seed=0)
    _, grads = loss_and_gradients(net, torch.randn(2, 2, 3, 3), torch.tensor([0, 3]))
    by_name = {info.name: g for info, g in zip(net.infos, grads)}
    assert by_name["max/a/weights"].abs().min() > 0 and by_name["max/a/bias"].abs().min() > 0
    assert not by_name["max/b/weights"].any() and not by_name["max/b/bias"].any()


# ------------------------------------------------------------ evaluation
@pytest.mark.tensorflow
def test_eval_sums_agree_with_tensorflows_evaluation_step():
    from firescale.train.tensorflow.evaluation import make_eval_step

    pair = _pair(BLOCKS, batch=4)
    pair.torch_net(torch.from_numpy(pair.images), training=True)   # statistics stored, so test mode is sane
    pair.tf_net(pair.nhwc, training=True)
    got = eval_sums(pair.torch_net, torch.from_numpy(pair.images), torch.from_numpy(pair.labels))
    want = make_eval_step(pair.tf_net, 10, BLOCKS.input_shape)(pair.nhwc, pair.labels).numpy()
    assert got.dtype == np.float64 and got[3] == 4
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_top_k_counts_as_caffe_ties_against_and_k5_is_at_most_the_classes():
    logits = torch.tensor([[1.0, 3.0, 2.0], [2.0, 2.0, 0.0], [0.0, 1.0, 5.0], [1.0, 0.0, 0.0]])
    labels = torch.tensor([2, 0, 2, 1])
    assert float(topk_correct(logits, labels, 1)) == 1     # row 1's tie with a better class counts against it
    assert float(topk_correct(logits, labels, 2)) == 3     # row 3's true class ties with class 2 for second
    spec = NetSpec("three", (1, 1, 2), 3, (FC("ip", 3, weight_init=G), Softmax()))
    net = CaffeNet(spec, seed=0)
    images = torch.randn(6, 2, 1, 1)
    sums = eval_sums(net, images, torch.tensor([0, 1, 2, 0, 1, 2]))
    assert sums[2] == 6 and sums[3] == 6                   # top-5 over 3 classes: top-3, every image
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(net(images), torch.tensor([0, 1, 2, 0, 1, 2]), reduction="sum")
    assert sums[0] == pytest.approx(loss.item(), rel=1e-6)


# ------------------------------------------------------------ blobs in and out
def test_write_params_takes_the_trainers_layout_and_refuses_another_shape_naming_the_blob():
    spec = NetSpec("io", (4, 3, 2), 5, (Conv("c", 3, 2, kernel_w=3, weight_init=G), Flatten("f"), FC("ip", 5),
                                        Softmax()))
    net = CaffeNet(spec, seed=2)
    assert tuple(net.param("c/weights").shape) == (3, 2, 2, 3)       # OIHW
    assert tuple(net.param("ip/weights").shape) == (5, 3 * 3 * 1)    # (out, in over C, H, W)
    rng = np.random.default_rng(0)
    arrays = {i.name: rng.normal(size=i.shape).astype(np.float32) for i in net.infos}
    net.write_params({"c/weights": arrays["c/weights"]})
    assert np.array_equal(net.read_params()["c/weights"], arrays["c/weights"])
    assert not np.array_equal(net.read_params()["ip/weights"], arrays["ip/weights"])   # the others kept
    net.write_params(arrays)
    assert all(np.array_equal(net.read_params()[k], v) for k, v in arrays.items())
    w = arrays["c/weights"]
    assert np.array_equal(net.param("c/weights").detach().numpy(), w.transpose(3, 2, 0, 1))
    assert np.array_equal(to_trainer_layout(net, "c/weights", from_trainer_layout(net, "c/weights", w)), w)
    with pytest.raises(FirescaleError, match=r"blob 'ip/weights'.*\(4, 5\).*\(9, 5\)"):
        net.write_params({"ip/weights": np.zeros((4, 5), np.float32)})
    with pytest.raises(FirescaleError, match="no blob 'ip/scale'"):
        net.write_params({"ip/scale": np.zeros(5, np.float32)})
    assert [p.requires_grad for p in net.params] == [True] * 4
    assert all(p.dtype == torch.float32 for p in net.params)


def test_batch_norm_statistics_are_buffers_without_gradient_and_zero_gradients():
    spec = NetSpec("bn", (4, 4, 2), 3, (BatchNorm("bn"), Scale("s", bias=True), FC("ip", 3), Softmax()))
    net = CaffeNet(spec, seed=0)
    assert net.learnt == [False, False, False, True, True, True, True]
    assert [p.requires_grad for p in net.statistics] == [False] * 3
    assert {name for name, _ in net.named_buffers()} == {"bn/mean", "bn/variance", "bn/factor"}
    images, labels = torch.randn(2, 2, 4, 4), torch.tensor([0, 2])
    _, grads = loss_and_gradients(net, images, labels)
    assert [bool(g.any()) for g in grads] == [False, False, False, True, True, True, True]
    assert float(net.param("bn/factor")[0]) == 1.0
    before = net.read_params()
    eval_sums(net, images, labels)                          # the TEST phase leaves the statistics alone
    assert all(np.array_equal(before[k], v) for k, v in net.read_params().items())


def test_dropout_draws_its_mask_from_the_generator_in_training_only():
    spec = NetSpec("drop", (1, 1, 400), 400, (Dropout("d", 0.25), Softmax()))
    net = CaffeNet(spec, seed=0)
    x = torch.ones(2, 400, 1, 1)
    assert torch.equal(net(x), x.reshape(2, 400))
    a = net(x, training=True, dropout_generator=torch.Generator().manual_seed(7))
    b = net(x, training=True, dropout_generator=torch.Generator().manual_seed(7))
    c = net(x, training=True, dropout_generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert set(a.unique().tolist()) == {0.0, float(np.float32(1.0 / 0.75))}   # kept values scaled by 1 / (1 - rate)
    assert 0.15 < float((a == 0).float().mean()) < 0.35
    with pytest.raises(ValueError, match="dropout_generator"):
        net(x, training=True)


@dataclass(frozen=True)
class Swish:
    """A layer kind the builder does not know."""

    name: str


def test_a_layer_kind_the_builder_lacks_is_refused_in_one_sentence_naming_it():
    spec = NetSpec("odd", (4, 4, 2), 2, (Conv("c", 2, 1, weight_init=constant(1.0)),
                                         Branches("blk", ((Swish("swish"),), ())), Softmax()))
    with pytest.raises(FirescaleError) as error:
        CaffeNet(spec, seed=0)
    message = str(error.value)
    assert "layer 'blk/swish'" in message and "Swish" in message and "BatchNorm" in message
    assert "\n" not in message and message.count(". ") == 0
