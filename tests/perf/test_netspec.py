"""The shared network definitions: shapes as Caffe computes them, initialisations, errors."""
from __future__ import annotations

import pytest

from firescale.errors import FirescaleError
from firescale.nets.spec import Conv, Pool, infer_shapes, pool_extra_padding, pool_output_size
from firescale.nets.zoo import NET_NAMES, get_net


def _shape(spec, name):
    return next(r.output_shape for r in infer_shapes(spec) if r.name == name)


def test_every_net_ends_in_its_classes():
    for name in NET_NAMES:
        spec = get_net(name)
        assert infer_shapes(spec)[-1].output_shape == (1, 1, spec.num_classes)
    assert _shape(get_net("nin", num_classes=10), "cccp8") == (6, 6, 10)


def test_caffe_shapes_of_the_imagenet_nets():
    nin = get_net("nin")
    assert nin.input_shape == (224, 224, 3)
    assert _shape(nin, "conv1") == (54, 54, 96)
    assert _shape(nin, "pool1") == (27, 27, 96)  # ceil rounding, as Caffe
    assert _shape(nin, "pool3") == (6, 6, 384)
    alex = get_net("alexnet")
    assert alex.input_shape == (227, 227, 3)
    assert _shape(alex, "conv1") == (55, 55, 96)
    assert _shape(alex, "pool5") == (6, 6, 256)
    goog = get_net("googlenet")
    assert _shape(goog, "pool1/3x3_s2") == (56, 56, 64)
    assert _shape(goog, "inception_3a") == (28, 28, 256)
    assert _shape(goog, "inception_5b") == (7, 7, 1024)
    assert _shape(get_net("vgg19"), "pool5") == (7, 7, 512)


def test_lenet_same_fits_8x8_digits_and_28x28():
    assert _shape(get_net("lenet_same", input_shape=(8, 8, 1)), "pool2") == (2, 2, 50)
    assert _shape(get_net("lenet_same"), "pool2") == (7, 7, 50)


def test_firecaffe_initialisations_are_recorded():
    nin = get_net("nin")
    convs = {layer.name: layer for layer in nin.layers if isinstance(layer, Conv)}
    assert convs["conv1"].weight_init.std == 0.05 and convs["cccp1"].weight_init.std == 0.01
    assert convs["conv1"].bias_init.value == 0.0
    goog = get_net("googlenet")
    first = goog.layers[0]
    assert first.weight_init.kind == "xavier" and first.bias_init.value == 0.2


def test_pool_rounding_and_padding_for_floor_frameworks():
    pool = Pool("p", "max", 3, 2)
    assert pool_output_size(112, pool) == 56
    assert pool_extra_padding(112, pool) == 1  # TF 'valid' needs one more row/column to give 56
    assert pool_extra_padding(8, Pool("p", "max", 2, 2)) == 0


def test_errors_name_the_net_and_layer():
    with pytest.raises(FirescaleError, match="unknown net 'resnet'"):
        get_net("resnet")
    with pytest.raises(FirescaleError, match="too small"):
        get_net("alexnet", input_shape=(8, 8, 3))
