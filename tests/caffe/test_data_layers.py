"""A net file's data layers: their transform_param read as Caffe's, the TRAIN batch_size as the batch per rank,
the transform from the file unless the command line says otherwise, and what test_iter counts."""
from __future__ import annotations

from pathlib import Path

import pytest

from firescale.caffe.net import DataParam, parse_net
from firescale.data.transforms import Transform
from firescale.errors import FirescaleError
from firescale.resources import caffe_zoo_file
from firescale.train.data_layers import data_transform, first_batch, read_data_layers, test_images

ZOO = Path(str(caffe_zoo_file("")))
TINY = Path(__file__).parent / "net_files" / "tiny_resnet.prototxt"
LAYERS = """\
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 10 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _net(tmp_path: Path, train: str, test: str = "batch_size: 20", name: str = "net.prototxt") -> Path:
    path = tmp_path / name
    path.write_text(
        f'layer {{ name: "d" type: "Data" top: "data" top: "label" include {{ phase: TRAIN }} {train} }}\n'
        f'layer {{ name: "t" type: "Data" top: "data" top: "label" include {{ phase: TEST }} '
        f'data_param {{ source: "x" {test} }} }}\n' + LAYERS)
    return path


def test_transform_param_is_read_with_caffes_defaults():
    caffenet = parse_net((ZOO / "bvlc_reference_caffenet" / "train_val.prototxt").read_text(), "caffenet")
    assert caffenet.layers[0].settings == DataParam("examples/imagenet/ilsvrc12_train_lmdb", 256, (227, 227, 3), 227,
                                                    mean_file="data/ilsvrc12/imagenet_mean.binaryproto", mirror=True)
    tiny = parse_net(TINY.read_text(), "tiny")
    assert tiny.layers[0].settings == DataParam("digits_train_lmdb", 16)   # scale 1, no mean, crop, mirror
    text = ('layer { name: "d" type: "Data" top: "data" transform_param { scale: 0.5 mean_value: 104 '
            'mean_value: 117 mean_value: 123 } data_param { batch_size: 4 } }\n')
    param = parse_net(text, "m").layers[0].settings
    assert isinstance(param, DataParam) and (param.scale, param.mean_value) == (0.5, (104.0, 117.0, 123.0))
    with pytest.raises(FirescaleError, match=r"both: layer 'd' \(Data\) transform_param: gives both 'mean_file' "
                                             r"and 'mean_value'; Caffe takes one of them"):
        parse_net(text.replace("scale: 0.5", 'mean_file: "m.binaryproto"'), "both")


def test_the_train_layers_batch_size_is_the_batch_per_rank_unless_the_command_line_gives_one(tmp_path):
    layers = read_data_layers(str(_net(tmp_path, "data_param { source: \"x\" batch_size: 100 }")))
    per_rank, total, note = first_batch(layers, None, None, 4)
    assert (per_rank, total) == (100, None)
    assert note == f"{tmp_path}/net.prototxt: the TRAIN data layer 'd' batch_size: 100 is the batch per rank, " \
                   "as Caffe's is per GPU"
    assert first_batch(layers, 100, None, 4) == (100, None, "")
    assert first_batch(layers, None, 400, 4) == (None, 400, "")
    _, _, note = first_batch(layers, None, 64, 4)
    assert note.endswith("the TRAIN data layer 'd' batch_size: 100 (per GPU in Caffe) is set aside for "
                         "--total-batch 64 (16 per rank)")
    assert first_batch(read_data_layers("lenet_same"), None, None, 2) == (64, None, "")   # a net written in Python
    assert first_batch(read_data_layers("cifar10_quick"), None, None, 2)[0] == 100    # Caffe's shipped file


def test_the_files_transform_applies_unless_an_option_sets_it_aside(tmp_path):
    net = _net(tmp_path, 'transform_param { scale: 0.00390625 mean_value: 33 crop_size: 6 mirror: true } '
                         'data_param { batch_size: 8 }')
    layers = read_data_layers(str(net))
    assert data_transform(layers, scale=None, mean=None, crop=None, mirror=None) == \
        (Transform(scale=0.00390625, mean=(33.0,), crop=6, mirror=True), [])
    transform, notes = data_transform(layers, scale=0.5, mean=(1.0,), crop=6, mirror=False)
    assert transform == Transform(scale=0.5, mean=(1.0,), crop=6, mirror=False)
    where = f"{net}: the TRAIN data layer 'd' transform_param"
    assert notes == [f"{where} scale: 0.00390625 is set aside for --scale 0.5",
                     f"{where} mean_value: 33 is set aside for --mean 1",
                     f"{where} mirror: true is set aside for --no-mirror"]
    # Caffe's defaults where the file says nothing: scale 1, no mean; a built-in net: 1/255
    bare = read_data_layers(str(_net(tmp_path, 'data_param { batch_size: 8 }', name="bare.prototxt")))
    assert data_transform(bare, scale=None, mean=None, crop=None, mirror=None) == (Transform(scale=1.0), [])
    assert data_transform(read_data_layers("lenet_same"), scale=None, mean=None, crop=None, mirror=None) == \
        (Transform(scale=1 / 255), [])


def test_a_mean_file_is_found_beside_the_net_file_or_refused(tmp_path):
    net = _net(tmp_path, 'transform_param { mean_file: "means/m.npy" } data_param { batch_size: 8 }')
    layers = read_data_layers(str(net))
    with pytest.raises(FirescaleError, match=r"net.prototxt: the TRAIN data layer 'd' transform_param mean_file: "
                                             r"'means/m.npy' names no file .*; give the mean with --mean"):
        data_transform(layers, scale=None, mean=None, crop=None, mirror=None)
    transform, notes = data_transform(layers, scale=None, mean=(5.0,), crop=None, mirror=None)
    assert transform.mean == (5.0,) and notes == [f"{net}: the TRAIN data layer 'd' transform_param mean_file: "
                                                  "'means/m.npy' is set aside for --mean 5"]
    (tmp_path / "means").mkdir()
    (tmp_path / "means" / "m.npy").write_bytes(b"")
    transform, _ = data_transform(layers, scale=None, mean=None, crop=None, mirror=None)
    assert transform.mean == str(tmp_path / "means" / "m.npy")


def test_test_iter_counts_batches_of_the_test_nets_batch_size(tmp_path):
    layers = read_data_layers(str(_net(tmp_path, "data_param { batch_size: 100 }")))
    images, note = test_images(3, layers, 256, 1000)
    assert images == 60 and note == (f"each evaluation reads the first 60 test images: test_iter 3 x batch_size 20 "
                                     f"of the TEST data layer 't' in {tmp_path}/net.prototxt")
    images, note = test_images(100, layers, 256, 1000)
    assert images == 1000 and note.startswith("test_iter 100 x batch_size 20") and \
        note.endswith("= 2000 images, more than the 1000 of the test split: each evaluation reads the split once "
                      "(Caffe would wrap around)")
    assert test_images(None, layers, 256, 1000) == (1000, "")
    # no TEST data layer (a built-in net, or one without a batch_size): test_iter batches of --eval-batch
    images, note = test_images(3, read_data_layers("lenet_same"), 256, 1000)
    assert images == 768 and note.endswith("test_iter 3 x --eval-batch 256 (no TEST data layer gives a batch_size)")
    no_batch = read_data_layers(str(_net(tmp_path, "", test="", name="nobatch.prototxt")))
    assert test_images(2, no_batch, 50, 1000)[0] == 100


def test_a_solvers_test_net_gives_the_test_batch(tmp_path):
    net = _net(tmp_path, "data_param { batch_size: 100 }")
    other = _net(tmp_path, "data_param { batch_size: 1 }", test="batch_size: 7", name="test.prototxt")
    layers = read_data_layers(str(net), other)
    assert test_images(2, layers, 256, 1000)[0] == 14 and layers.test_source == str(other)
    assert first_batch(layers, None, None, 1)[0] == 100   # the TRAIN batch stays the trained file's
