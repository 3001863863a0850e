"""The trainer refuses, in one sentence naming the layer and kind, the layers of Caffe files it cannot build yet."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from firescale.errors import FirescaleError
from firescale.nets.zoo import get_net


def test_the_trainer_names_the_first_layer_it_cannot_build():
    from firescale.train.nets import CaffeNet

    with pytest.raises(FirescaleError, match=r"net 'resnet50' layer 'bn_conv1': the trainer cannot train a "
                                             r"BatchNorm layer yet; the performance model \(predict\) takes it"):
        CaffeNet(get_net("resnet50"), seed=1)
    spec = get_net("resnet50")
    no_bias = replace(spec, layers=(replace(spec.layers[0], bias=False),))
    with pytest.raises(FirescaleError, match=r"layer 'conv1': the trainer cannot train a Conv without a bias "
                                             r"\(bias_term: false\) layer yet"):
        CaffeNet(no_bias, seed=1)
    oblong = replace(spec, layers=(replace(spec.layers[0], kernel_w=5, dilation=2),))
    with pytest.raises(FirescaleError, match=r"layer 'conv1': the trainer cannot train a Conv with kernel 7x5, "
                                             r"stride 2x2, pad 3x3 and dilation 2 \(it builds one size for both "
                                             r"axes, no dilation\) layer yet"):
        CaffeNet(oblong, seed=1)
    with pytest.raises(FirescaleError, match=r"net 'cifar10_full' layer 'norm1': the trainer cannot train a LRN "
                                             r"WITHIN_CHANNEL layer yet"):
        CaffeNet(get_net("cifar10_full"), seed=1)


def test_a_caffe_file_of_known_kinds_builds_as_the_python_net():
    from firescale.train.nets import CaffeNet

    quick = CaffeNet(get_net("cifar10_quick"), seed=3)
    assert [info.name for info in quick.infos][:2] == ["conv1/weights", "conv1/bias"]
    assert sum(int(np.prod(info.shape)) for info in quick.infos) == 145_578
    logits = quick(np.zeros((2, 32, 32, 3), np.float32))
    assert tuple(logits.shape) == (2, 10)
