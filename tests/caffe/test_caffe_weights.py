"""The trainer's weights in Caffe's layouts and back: exact both ways, the same arithmetic as Caffe's, by name."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from firescale.caffe.caffemodel import read_caffemodel
from firescale.errors import FirescaleError
from firescale.nets.spec import FC, Conv, NetSpec, Pool, ReLU, Softmax
from firescale.nets.zoo import get_net
from firescale.train.caffe_weights import caffe_layouts, from_caffe, net_from_caffe, net_to_caffe, to_caffe

LENET = Path(__file__).parent / "data" / "lenet_iter_10000.caffemodel"
# A grouped convolution, Caffe's ceil-rounded pooling (6x5 -> 3x3) and an InnerProduct after them.
SMALL = NetSpec("small", (6, 5, 4), 3, (Conv("conv1", 6, 3, pad=1, groups=2), Pool("pool1", "max", 2, 2),
                                       FC("ip1", 7), ReLU("relu1"), FC("ip2", 3), Softmax()))


def _random(layouts, rng, integers=False):
    draw = (lambda s: rng.integers(-3, 4, size=s).astype(np.float32)) if integers else \
        (lambda s: rng.standard_normal(s).astype(np.float32))
    return {b.param: draw(b.trainer_shape) for blobs in layouts.values() for b in blobs}


def test_layouts_are_caffes_shapes():
    layouts = caffe_layouts(SMALL)
    assert {k: [(b.trainer_shape, b.caffe_shape) for b in v] for k, v in layouts.items()} == {
        "conv1": [((3, 3, 2, 6), (6, 2, 3, 3)), ((6,), (6,))],
        "ip1": [((54, 7), (7, 54)), ((7,), (7,))],
        "ip2": [((7, 3), (3, 7)), ((3,), (3,))]}
    assert layouts["ip1"][0].flat_input == (3, 3, 6)


def test_conversion_is_a_permutation_exact_both_ways():
    rng = np.random.default_rng(5)
    for spec in (SMALL, get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1)),
                 get_net("alexnet", num_classes=5, input_shape=(67, 67, 3))):
        layouts = caffe_layouts(spec)
        weights = _random(layouts, rng)
        caffe = net_to_caffe(spec, weights)
        for layer, blobs in layouts.items():
            for layout, array in zip(blobs, caffe[layer]):
                assert array.shape == layout.caffe_shape and array.dtype == np.float32
                assert np.array_equal(np.sort(array, axis=None), np.sort(weights[layout.param], axis=None))
        back = net_from_caffe(spec, caffe, "x.caffemodel").weights
        assert back.keys() == weights.keys()
        assert all(back[k].tobytes() == weights[k].tobytes() for k in weights), spec.name


def _conv_trainer(x, kernel, groups, pad):
    """The trainer's convolution on one HWC image: HWIO kernels, the channels split into groups."""
    x = np.pad(x, ((pad, pad), (pad, pad), (0, 0)))
    k = kernel.shape[0]
    h, w = x.shape[0] - k + 1, x.shape[1] - k + 1
    outs = []
    for xs, ks in zip(np.split(x, groups, axis=-1), np.split(kernel, groups, axis=-1)):
        patches = np.stack([xs[i:i + h, j:j + w] for i in range(k) for j in range(k)], axis=2)  # h, w, k*k, c
        outs.append(np.einsum("hwpc,pco->hwo", patches, ks.reshape(k * k, ks.shape[2], ks.shape[3])))
    return np.concatenate(outs, axis=-1)


def _conv_caffe(x, weight, groups, pad):
    """Caffe's convolution on one CHW image: OIHW weights, output o reads input group o // (O / groups)."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    o_all, i_per, k, _ = weight.shape
    h, w = x.shape[1] - k + 1, x.shape[2] - k + 1
    y = np.zeros((o_all, h, w))
    for o in range(o_all):
        g = o // (o_all // groups)
        for i in range(i_per):
            for a in range(k):
                for b in range(k):
                    y[o] += weight[o, i, a, b] * x[g * i_per + i, a:a + h, b:b + w]
    return y


def test_converted_weights_compute_what_caffe_computes():
    """Integer values, so that both orders of summation are exact: a grouped convolution and an InnerProduct
    after a feature map give the same numbers from the trainer's arrays as Caffe's arithmetic from Caffe's."""
    rng = np.random.default_rng(2)
    layouts = caffe_layouts(SMALL)
    weights = _random(layouts, rng, integers=True)
    caffe = net_to_caffe(SMALL, weights)
    x = rng.integers(-3, 4, size=(6, 5, 4)).astype(np.float64)
    ours = _conv_trainer(x, weights["conv1/weights"].astype(np.float64), 2, 1)
    theirs = _conv_caffe(x.transpose(2, 0, 1), caffe["conv1"][0].astype(np.float64), 2, 1)
    assert np.array_equal(ours.transpose(2, 0, 1), theirs)
    feature = rng.integers(-3, 4, size=(3, 3, 6)).astype(np.float64)       # H, W, C before ip1
    ours_fc = feature.reshape(-1) @ weights["ip1/weights"].astype(np.float64)
    theirs_fc = caffe["ip1"][0].astype(np.float64) @ feature.transpose(2, 0, 1).reshape(-1)   # C, H, W
    assert np.array_equal(ours_fc, theirs_fc)


def test_layers_copy_by_name_as_caffes_copy_trained_layers_from():
    rng = np.random.default_rng(3)
    caffe = net_to_caffe(SMALL, _random(caffe_layouts(SMALL), rng))
    given = {"data": [], "conv1": caffe["conv1"], "ip2": [caffe["ip2"][0][None, None], caffe["ip2"][1]],
             "fc8": [np.zeros((2, 2), np.float32)]}
    copied = net_from_caffe(SMALL, given, "w.caffemodel")
    assert copied.copied == ["conv1", "ip2"] and copied.kept == ["ip1"] and copied.ignored == ["fc8"]
    assert sorted(copied.weights) == ["conv1/bias", "conv1/weights", "ip2/bias", "ip2/weights"]
    # the old 4-D num/channels/height/width shape (1, 1, 3, 7) of ip2's weights fits as in Caffe
    assert np.array_equal(copied.weights["ip2/weights"], caffe["ip2"][0].T)


def test_a_caffe_lenet_on_digits_refuses_ip1_naming_file_layer_blob_and_shape():
    spec = get_net("lenet_same", num_classes=10, input_shape=(8, 8, 1))
    with pytest.raises(FirescaleError) as err:
        net_from_caffe(spec, read_caffemodel(LENET), LENET)
    assert str(err.value) == (f"{LENET}: layer 'ip1' blob 0 (weights) has shape (500, 800), but net 'lenet_same' "
                              "expects (500, 200); rename the layer to learn it from its filler instead")


def test_a_layer_with_another_number_of_blobs_is_refused():
    caffe = net_to_caffe(SMALL, _random(caffe_layouts(SMALL), np.random.default_rng(4)))
    with pytest.raises(FirescaleError, match=r"w.caffemodel: layer 'ip1' has 1 blobs, but the net's 'ip1' has 2"):
        net_from_caffe(SMALL, {"ip1": caffe["ip1"][:1]}, "w.caffemodel")


def test_to_and_from_caffe_are_inverse_for_history_too():
    layout = caffe_layouts(SMALL)["ip1"][0]
    array = np.random.default_rng(6).standard_normal(layout.trainer_shape).astype(np.float32)
    assert from_caffe(layout, to_caffe(layout, array)).tobytes() == array.tobytes()
