"""Caffe's net files read on the one prototxt reader: phases, V1 layers, params, the DAG and its errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from firescale.caffe.net import Convolution, DataParam, ParamSpec, Pooling, parse_net, read_net
from firescale.errors import FirescaleError
from firescale.resources import caffe_zoo_file

ZOO = Path(str(caffe_zoo_file("")))
V1_LENET = Path(__file__).parent / "net_files" / "lenet_v1.prototxt"
SHIPPED = sorted(ZOO.rglob("*.prototxt"))


def _write(tmp_path: Path, body: str, name: str = "net.prototxt") -> Path:
    path = tmp_path / name
    path.write_text('name: "t"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n' + body)
    return path


def _conv(name: str, bottom: str, top: str, out: int = 4, kernel: int = 3) -> str:
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {out} kernel_size: {kernel} pad: 1 }} }}\n')


def test_every_shipped_file_reads_in_both_phases():
    assert len(SHIPPED) == 12
    for path in SHIPPED:
        for phase in ("TRAIN", "TEST"):
            net = read_net(path, phase)
            assert net.layers and net.phase == phase
    train, test = read_net(ZOO / "mnist" / "lenet_train_test.prototxt"), \
        read_net(ZOO / "mnist" / "lenet_train_test.prototxt", "TEST")
    assert [layer.name for layer in train.layers] == ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1",
                                                      "ip2", "loss"]
    assert [layer.name for layer in test.layers][-2:] == ["accuracy", "loss"]
    assert train.layers[0].settings == DataParam("examples/mnist/mnist_train_lmdb", 64, None, 0, scale=0.00390625)
    assert test.layers[0].settings == DataParam("examples/mnist/mnist_test_lmdb", 100, None, 0, scale=0.00390625)


def test_layers_keep_their_params_fillers_and_blobs():
    net = read_net(ZOO / "bvlc_reference_caffenet" / "train_val.prototxt")
    conv2 = net.layer("conv2")
    assert conv2.params == (ParamSpec(1.0, 1.0), ParamSpec(2.0, 0.0))
    s = conv2.settings
    assert isinstance(s, Convolution)
    assert (s.num_output, s.kernel, s.pad, s.group, s.bias_term) == (256, (5, 5), (2, 2), 2, True)
    assert (s.weight_filler.type, s.weight_filler.std, s.bias_filler.value) == ("gaussian", 0.01, 1.0)
    assert net.layer("relu1").in_place and net.layer("relu1").bottom == ("conv1",)
    assert net.layers[0].settings == DataParam("examples/imagenet/ilsvrc12_train_lmdb", 256, (227, 227, 3), 227,
                                               mean_file="data/ilsvrc12/imagenet_mean.binaryproto", mirror=True)
    deploy = read_net(ZOO / "resnet" / "ResNet-50-deploy.prototxt")
    assert deploy.inputs == (("data", (1, 3, 224, 224)),)
    pool = deploy.layer("pool5").settings
    assert isinstance(pool, Pooling) and (pool.pool, pool.kernel, pool.stride) == ("AVE", (7, 7), (1, 1))
    assert deploy.layer("res2a_branch1").settings.bias_term is False  # type: ignore[union-attr]


def test_a_v1_net_reads_as_its_new_format_twin():
    for phase in ("TRAIN", "TEST"):
        old, new = read_net(V1_LENET, phase), read_net(ZOO / "mnist" / "lenet_train_test.prototxt", phase)
        assert old.v1 and not new.v1
        assert old.layers == new.layers
    assert old.layer("loss").type == "SoftmaxWithLoss" and old.layer("conv1").params[1] == ParamSpec(2.0, 1.0)


def test_v1_weight_decay_is_the_decay_mult(tmp_path):
    path = _write(tmp_path, 'layers { name: "c" type: CONVOLUTION bottom: "data" top: "c" blobs_lr: 1 blobs_lr: 2 '
                            'weight_decay: 1 weight_decay: 0 convolution_param { num_output: 2 kernel_size: 1 } }\n')
    assert read_net(path).layer("c").params == (ParamSpec(1.0, 1.0), ParamSpec(2.0, 0.0))


def test_phase_rules(tmp_path):
    body = (_conv("a", "data", "a") + 'layer { name: "d" type: "Dropout" bottom: "a" top: "a" '
            'exclude { phase: TEST } }\n')
    path = _write(tmp_path, body)
    assert [layer.name for layer in read_net(path, "TRAIN").layers] == ["a", "d"]
    assert [layer.name for layer in read_net(path, "TEST").layers] == ["a"]
    staged = _write(tmp_path, _conv("a", "data", "a").replace("} }\n", "} include { stage: \"x\" } }\n"), "s.prototxt")
    with pytest.raises(FirescaleError, match=r"s\.prototxt: layer 'a': include/exclude uses stage; firescale "
                                             r"chooses layers by phase only"):
        read_net(staged)


def test_an_unsupported_layer_type_is_refused_naming_file_layer_and_type(tmp_path):
    deconv = 'layer { name: "up" type: "Deconvolution" bottom: "a" top: "b" }\n'
    path = _write(tmp_path, _conv("a", "data", "a") + deconv)
    with pytest.raises(FirescaleError, match=r"net\.prototxt: layer 'up' has type 'Deconvolution', which firescale "
                                             r"does not support; supported: Data, "):
        read_net(path)
    v1 = _write(tmp_path, 'layers { name: "w" type: WINDOW_DATA top: "data" }\n', "v1.prototxt")
    with pytest.raises(FirescaleError, match=r"v1\.prototxt: layer 'w' has type 'WINDOW_DATA'"):
        read_net(v1)


def test_a_missing_bottom_a_cycle_and_a_late_bottom_are_refused(tmp_path):
    missing = _write(tmp_path, _conv("a", "data", "a") + _conv("b", "nothing", "b"))
    with pytest.raises(FirescaleError, match=r"net\.prototxt: layer 'b' \(Convolution\) reads blob 'nothing', which "
                                             r"no layer of the TRAIN phase writes; expected the top of an earlier"):
        read_net(missing)
    cycle = _write(tmp_path, _conv("a", "b", "a") + _conv("b", "a", "b"), "cycle.prototxt")
    with pytest.raises(FirescaleError, match=r"cycle\.prototxt: layer 'a' \(Convolution\) reads blob 'b', which "
                                             r"layer 'b' writes from 'a''s own output: a cycle"):
        read_net(cycle)
    late = _write(tmp_path, _conv("a", "b", "a") + _conv("b", "data", "b"), "late.prototxt")
    with pytest.raises(FirescaleError, match=r"late\.prototxt: layer 'a' \(Convolution\) reads blob 'b' before layer "
                                             r"'b' writes it"):
        read_net(late)


def test_malformed_settings_name_the_layer(tmp_path):
    nonsquare = _write(tmp_path, 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
                                 'convolution_param { num_output: 2 kernel_h: 3 } }\n')
    with pytest.raises(FirescaleError, match=r"layer 'c' \(Convolution\) convolution_param: give both 'kernel_h' "
                                             r"and 'kernel_w'"):
        read_net(nonsquare)
    no_kernel = _write(tmp_path, 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" }\n', "p.prototxt")
    with pytest.raises(FirescaleError, match=r"p\.prototxt: layer 'p' \(Pooling\) pooling_param: 'kernel_size' is "
                                             r"missing"):
        read_net(no_kernel)
    with pytest.raises(FirescaleError, match=r"x\.prototxt: solvers is not a field of a Caffe net file"):
        parse_net('solvers: 1\nlayer { name: "a" type: "ReLU" }', "x.prototxt")
    with pytest.raises(FirescaleError, match=r"v0\.prototxt: layer 0 is in Caffe's V0 format"):
        parse_net('layers { layer { name: "a" type: "relu" } }', "v0.prototxt")


def test_solver_files_still_read_as_before():
    from firescale.caffe.prototxt import parse_prototxt

    with pytest.raises(FirescaleError, match="s.prototxt: solver key 'base_lr' is given twice"):
        parse_prototxt("base_lr: 0.1\nbase_lr: 0.2\n", "s.prototxt")
    assert parse_prototxt("stepvalue: 1 stepvalue: 2", "s")["stepvalue"] == [1, 2]


def test_the_shipped_files_are_byte_for_byte_as_published():
    import hashlib
    import re

    table = dict((path, sha) for sha, path in re.findall(r"\| `([0-9a-f]{40})` \| `([^`]+)` \|",
                                                          (ZOO / "README.md").read_text()))
    assert sorted(table) == sorted(p.relative_to(ZOO).as_posix() for p in SHIPPED)
    for path in SHIPPED:
        assert hashlib.sha1(path.read_bytes()).hexdigest() == table[path.relative_to(ZOO).as_posix()], path
    assert (ZOO / "LICENSE.caffe").read_text().count("Redistribution and use in source and binary forms") == 1
    assert "The MIT License" in (ZOO / "LICENSE.deep-residual-networks").read_text()
