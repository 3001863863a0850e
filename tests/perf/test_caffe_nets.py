"""Caffe's own net files as NetSpecs: parameter counts as Caffe counts them, DAG blocks, the zoo beside them."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from firescale.errors import FirescaleError
from firescale.model.layers import net_cost
from firescale.model.memory import net_memory
from firescale.model.paleo_flops import paleo_net_cost
from firescale.nets.caffe_file import load_net_file
from firescale.nets.device_plan import arch_devices, record_devices
from firescale.nets.spec import BatchNorm, Branches, Conv, Scale, infer_shapes
from firescale.nets.zoo import CAFFE_NETS, NET_NAMES, get_net
from firescale.resources import caffe_zoo_file

ZOO = Path(str(caffe_zoo_file("")))


def _params(relative: str, **kw) -> int:
    return net_cost(load_net_file(ZOO / relative, **kw), 1).params


def test_parameter_counts_equal_caffes():
    # LeNet: conv1 20·25+20, conv2 50·20·25+50, ip1 500·(4·4·50)+500, ip2 10·500+10.
    lenet = 520 + 25_050 + 400_500 + 5_010
    assert _params("mnist/lenet_train_test.prototxt", input_shape=(28, 28, 1)) == lenet == 431_080
    assert _params("mnist/lenet.prototxt") == lenet
    # CIFAR-10 quick: conv 32·3·25+32, 32·32·25+32, 64·32·25+64; ip1 64·(4·4·64)+64; ip2 10·64+10.
    quick = 2_432 + 25_632 + 51_264 + 65_600 + 650
    assert _params("cifar10/cifar10_quick_train_test.prototxt", input_shape=(32, 32, 3)) == quick == 145_578
    assert _params("cifar10/cifar10_quick.prototxt") == quick
    # CIFAR-10 full: the same convolutions, then ip1 straight to 10 classes: 10·(4·4·64)+10.
    assert _params("cifar10/cifar10_full_train_test.prototxt", input_shape=(32, 32, 3)) == 2_432 + 25_632 + 51_264 \
        + 10_250
    for net in ("bvlc_alexnet", "bvlc_reference_caffenet"):
        for phase_file in ("train_val", "deploy"):
            assert _params(f"{net}/{phase_file}.prototxt") == 60_965_224
    assert net_cost(get_net("caffenet"), 1).params == 60_965_224


def test_googlenet_without_and_with_its_auxiliary_heads():
    deploy = load_net_file(ZOO / "bvlc_googlenet" / "deploy.prototxt")
    train = load_net_file(ZOO / "bvlc_googlenet" / "train_val.prototxt")
    # The Python-written GoogLeNet is this file without its auxiliary heads (SAME_AS_FILES below).
    assert net_cost(deploy, 1).params == net_cost(train, 1).params == net_cost(get_net("googlenet"), 1).params \
        == 6_998_552
    assert "the heads loss1/loss, loss2/loss" in train.notes[0]
    # Each auxiliary head: 1x1 conv to 128, fc 2048 -> 1024, classifier 1024 -> 1000 (Szegedy et al., Sec. 5).
    for head, channels in (("loss1", 512), ("loss2", 528)):
        spec = load_net_file(ZOO / "bvlc_googlenet" / "train_val.prototxt", output=f"{head}/loss")
        own = sum(c.params for c in net_cost(spec, 1).layers if c.name.startswith(head + "/"))
        assert own == (128 * channels + 128) + (2048 * 1024 + 1024) + (1024 * 1000 + 1000)


def test_resnet50_counts_learnt_parameters_and_batchnorm_statistics_apart():
    spec = get_net("resnet50")
    cost = net_cost(spec, 1)
    convs = [r for r in infer_shapes(spec) if isinstance(r.layer, Conv)]
    norms = [r for r in infer_shapes(spec) if isinstance(r.layer, BatchNorm)]
    assert len(convs) == len(norms) == 53
    assert [c.bias for c in (r.layer for r in convs)].count(True) == 1        # conv1 only (bias_term default)
    channels = sum(r.output_shape[2] for r in norms)
    assert channels == 26_560
    # torchvision's ResNet-50 (BatchNorm's gamma and beta as parameters): 25,557,032; Caffe's file adds conv1's bias.
    assert cost.params == 25_557_032 + 64
    assert cost.state == 2 * channels + len(norms)          # mean, variance and one scale factor per BatchNorm
    assert sum(cost.gradient_tensors) == cost.params
    assert sum(1 for layer in spec.layers if isinstance(layer, Branches) and layer.merge == "sum") == 16
    identity = [layer for layer in spec.layers if isinstance(layer, Branches) and () in layer.branches]
    assert len(identity) == 12                     # 16 blocks, 4 with a projection shortcut
    assert infer_shapes(spec)[-1].output_shape == (1, 1, 1000)
    scale = next(c for c in cost.layers if c.name == "scale_conv1")
    assert scale.params == 128 and scale.blobs == (64, 64)


def test_vgg16_and_vgg19_parameter_counts():
    assert net_cost(get_net("vgg16"), 1).params == 138_357_544
    assert net_cost(get_net("vgg19"), 1).params == 143_667_240


# The nets written in Python that share a name with a Caffe file, and that file (lenet is the file itself).
SAME_AS_FILES = {"alexnet": ("bvlc_alexnet/train_val.prototxt", None),
                 "googlenet": ("bvlc_googlenet/train_val.prototxt", None),
                 "lenet": ("mnist/lenet_train_test.prototxt", (28, 28, 1))}


def test_every_net_named_as_a_caffe_file_equals_it_layer_for_layer():
    assert [n for n in NET_NAMES if n not in CAFFE_NETS] == ["lenet_same", "nin", "alexnet", "googlenet", "vgg19",
                                                             "vgg16"]
    for name, (relative, shape) in SAME_AS_FILES.items():
        ours, theirs = get_net(name), load_net_file(ZOO / relative, input_shape=shape)
        # names, kernels, pads, strides, groups, fillers and every inception branch; GoogLeNet without the two
        # auxiliary heads, which the file's loader leaves out too (test_googlenet_without_and_with_...)
        assert ours.layers == theirs.layers, name
        assert (ours.input_shape, ours.num_classes) == (theirs.input_shape, theirs.num_classes), name
        assert [r.output_shape for r in infer_shapes(ours)] == [r.output_shape for r in infer_shapes(theirs)], name
    assert get_net("googlenet").source == "" and get_net("lenet").source.endswith("lenet_train_test.prototxt")


def test_lenet_same_is_caffes_lenet_padded_in_its_two_convolutions():
    same, caffes = get_net("lenet_same"), get_net("lenet")
    padded = [layer.name for layer, theirs in zip(same.layers, caffes.layers) if layer != theirs]
    assert padded == ["conv1", "conv2"] and len(same.layers) == len(caffes.layers)
    unpadded = tuple(replace(layer, pad=0) if isinstance(layer, Conv) else layer for layer in same.layers)
    assert unpadded == caffes.layers
    assert all(isinstance(layer, Conv) and layer.pad == 2 for layer in same.layers if layer.name in padded)
    # so that 8x8 digits fit, where Caffe's LeNet refuses them
    assert infer_shapes(get_net("lenet-same", input_shape=(8, 8, 1)))[-1].output_shape == (1, 1, 10)
    with pytest.raises(FirescaleError, match=r"lenet_train_test\.prototxt: net 'LeNet' layer 'conv2': its input "
                                             r"2x2 is too small for its 5x5 kernel"):
        get_net("lenet", input_shape=(8, 8, 1))


def test_dag_nets_go_through_every_consumer():
    spec = get_net("resnet50")
    memory = net_memory(spec, 8, "SGD")
    bn = memory.layer("bn_conv1")
    assert bn.weights == (2 * 64 + 1) * 4 and bn.weight_gradients == 0 and bn.history == 0
    assert memory.layer("res2b").kind == "eltwise" and memory.layer("res2b").backward_workspace == 0
    assert memory.peak > memory.resident > 0
    cost, paleo = net_cost(spec, 8), paleo_net_cost(spec, 8)
    add = next(c for c in cost.layers if c.name == "res2b")
    assert add.forward_flops == 8 * 56 * 56 * 256                  # one add per element of the two branches
    assert [c.name for c in paleo.layers] == [c.name for c in cost.layers]
    assert cost.activation_bytes > 0 and cost.training_flops > paleo.training_flops * 0.5
    devices = arch_devices([], spec, "plan")
    assert len(record_devices(spec, devices)) == len(memory.layers)
    assert isinstance(spec.layers[2], Scale)


def _net(tmp_path: Path, body: str, name: str = "bad.prototxt") -> Path:
    path = tmp_path / name
    path.write_text('name: "bad"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n' + body)
    return path


def _layer(name: str, kind: str, bottoms: tuple[str, ...], top: str, extra: str = "") -> str:
    b = " ".join(f'bottom: "{x}"' for x in bottoms)
    return f'layer {{ name: "{name}" type: "{kind}" {b} top: "{top}" {extra} }}\n'


def _conv(name: str, bottom: str, kernel: int = 3, pad: int = 1) -> str:
    return _layer(name, "Convolution", (bottom,), name,
                  f"convolution_param {{ num_output: 4 kernel_size: {kernel} pad: {pad} }}")


def test_a_residual_block_and_an_inception_module_by_hand(tmp_path):
    body = (_conv("a", "data") + _layer("relu", "ReLU", ("a",), "a") + _conv("b", "a")
            + _layer("sum", "Eltwise", ("a", "b"), "sum")
            + _conv("x/1", "sum") + _conv("x/2", "sum") + _layer("x/cat", "Concat", ("x/1", "x/2"), "cat")
            + _layer("fc", "InnerProduct", ("cat",), "fc", "inner_product_param { num_output: 3 }"))
    spec = load_net_file(_net(tmp_path, body))
    assert [layer.name for layer in spec.layers] == ["a", "relu", "sum", "x", "fc"]
    residual, inception = spec.layers[2], spec.layers[3]
    assert isinstance(residual, Branches) and residual.branches[0] == () and residual.merge == "sum"
    assert isinstance(inception, Branches) and [b[0].name for b in inception.branches] == ["1", "2"]
    assert [r.name for r in infer_shapes(spec)][3:6] == ["sum", "x/1", "x/2"]
    assert spec.num_classes == 3 and infer_shapes(spec)[-1].output_shape == (1, 1, 3)
    assert load_net_file(_net(tmp_path, body), num_classes=7).num_classes == 7


def test_bad_nets_are_refused_in_one_sentence(tmp_path):
    with pytest.raises(FirescaleError, match=r"bad\.prototxt: net 'bad' layer 'big': its input 8x8 is too small for "
                                             r"its 11x11 kernel \(padded by 1 it is 10x10\); expected a kernel of at "
                                             r"most 10x10 or a larger input"):
        load_net_file(_net(tmp_path, _conv("big", "data", kernel=11)))
    crossed = (_conv("a", "data") + _conv("b", "data") + _conv("c", "a")
               + _layer("m1", "Eltwise", ("a", "b"), "m1") + _layer("m2", "Eltwise", ("c", "m1"), "m2"))
    with pytest.raises(FirescaleError, match=r"bad\.prototxt: the branches from blob 'a' end in several layers "
                                             r"\('m1', 'm2'\); firescale takes nets whose branches meet again in one "
                                             r"merge layer \(series-parallel\)"):
        load_net_file(_net(tmp_path, crossed))
    scaled = _conv("a", "data") + _layer("s", "Scale", ("a", "data"), "s")
    with pytest.raises(FirescaleError, match=r"bad\.prototxt: layer 's' \(Scale\) reads 2 blobs; firescale merges "
                                             r"branches only in Concat and Eltwise layers"):
        load_net_file(_net(tmp_path, scaled))
    dilated = _layer("d", "Convolution", ("data",), "d", "convolution_param { num_output: 2 kernel_size: 3 "
                                                         "dilation: 4 }")
    with pytest.raises(FirescaleError, match=r"layer 'd': its input 8x8 is too small for its 9x9 kernel \(padded "
                                             r"by 0 it is 8x8\)"):
        load_net_file(_net(tmp_path, dilated))
    oblong = _layer("o", "Pooling", ("data",), "o", "pooling_param { kernel_h: 2 kernel_w: 3 }")
    with pytest.raises(FirescaleError, match=r"layer 'o' \(Pooling\): kernel 2x3 differs per axis; firescale takes "
                                             r"one kernel for both axes here"):
        load_net_file(_net(tmp_path, oblong))
    filler = _layer("f", "Convolution", ("data",), "f", "convolution_param { num_output: 2 kernel_size: 1 "
                                                        "weight_filler { type: \"bilinear\" } }")
    with pytest.raises(FirescaleError, match=r"layer 'f' \(Convolution\): weight_filler \{ type: 'bilinear' \}"):
        load_net_file(_net(tmp_path, filler))
    with pytest.raises(FirescaleError, match=r"lenet_train_test\.prototxt: the data layer 'mnist' \(Data\) does not "
                                             r"give the image size \(no crop_size or shape\); expected the input"):
        load_net_file(ZOO / "mnist" / "lenet_train_test.prototxt")


def test_predict_layers_of_lenet_is_caffes_and_of_lenet_same_the_padded_one(capsys):
    from firescale.cli import main

    assert main(["predict", "layers", "lenet", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "lenet: input (28, 28, 1) (H, W, C), 10 classes, batch 1, from " in out
    assert "total: 431,080 parameters," in out
    assert main(["predict", "layers", "lenet_same", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "lenet_same: input (28, 28, 1) (H, W, C), 10 classes, batch 1\n" in out
    assert "total: 1,256,080 parameters," in out    # its ip1 reads 7x7x50, not 4x4x50: 500·(2450 - 800) more


def test_predict_layers_takes_a_file_and_prints_the_total(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "layers",
                           str(ZOO / "bvlc_reference_caffenet" / "train_val.prototxt"), "--batch", "1"],
                          capture_output=True, text=True, check=True)
    assert "CaffeNet: input (227, 227, 3) (H, W, C), 1000 classes, batch 1, from " in proc.stdout
    assert "total: 60,965,224 parameters," in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "layers", "resnet50", "--batch", "1"],
                          capture_output=True, text=True, check=True)
    assert "total: 25,557,096 parameters (and 53,173 stored BatchNorm statistics, not learnt)" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "firescale", "predict", "layers", str(tmp_path / "none.prototxt")],
                          capture_output=True, text=True)
    # refused as the command line is read, as every --net is (tests/perf/test_net_argument.py)
    assert proc.returncode == 2 and f"{str(tmp_path / 'none.prototxt')!r} (no such file)" in proc.stderr


def test_a_plan_naming_a_layer_inside_a_residual_block_is_refused():
    from firescale.caffe.dist import LayerAssign

    spec = get_net("resnet50")
    with pytest.raises(FirescaleError, match=r"plan: layer_assign names 'res3a/res3a_branch1', a branch inside block "
                                             r"\(Eltwise SUM\) 'res3a' of net 'resnet50'; assign the whole module"):
        arch_devices([LayerAssign("res3a/res3a_branch1", 1)], spec, "plan")
    devices = arch_devices([LayerAssign("res3a", 1)], spec, "plan")
    names = [layer.name for layer in spec.layers]
    assert devices[names.index("res3a") - 1] == 0 and devices[names.index("res3a")] == 1


def test_a_convolution_per_axis_and_dilated():
    from firescale.caffe.net import parse_net
    from firescale.nets.caffe_file import spec_from_net

    text = ('input: "data" input_shape { dim: 1 dim: 2 dim: 9 dim: 12 }\n'
            'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 '
            'kernel_h: 1 kernel_w: 7 pad_h: 0 pad_w: 3 stride_h: 2 stride_w: 1 } }\n'
            'layer { name: "d" type: "Convolution" bottom: "c" top: "d" convolution_param { num_output: 3 '
            'kernel_size: 3 dilation: 2 pad: 2 } }\n')
    spec = spec_from_net(parse_net(text, "axes.prototxt"))
    c, d = spec.layers
    assert isinstance(c, Conv) and (c.kernel_hw, c.stride_hw, c.pad_hw, c.square) == ((1, 7), (2, 1), (0, 3), False)
    shapes = [r.output_shape for r in infer_shapes(spec)]
    assert shapes == [(5, 12, 4), (5, 12, 3)]          # (9 - 1) // 2 + 1 rows; a dilated 3x3 spans 5x5, padded 2
    cost = net_cost(spec, 2)
    assert [layer.params for layer in cost.layers] == [4 * 2 * 7 + 4, 3 * 4 * 9 + 3]
    assert cost.layers[1].forward_flops == 2.0 * (3 * 4 * 9 * 5 * 12 * 2) + 2 * 5 * 12 * 3
    assert net_memory(spec, 2).layer("c").forward_workspace == 2 * 9 * 18 * 2 * 4    # the input padded in width
    paleo = paleo_net_cost(spec, 2)
    assert paleo.layers[0].forward_flops == 2.0 * (1 * 7 * 2 * 5 * 12 * 4 * 2)
