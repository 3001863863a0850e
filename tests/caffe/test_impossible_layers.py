"""Every impossible shape or layer of a Caffe net file is one sentence naming the layer, from `predict layers
--net` and from planning a sweep with the net (issue 53): never a ZeroDivisionError or an AssertionError."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from firescale.cli import main
from firescale.errors import FirescaleError
from firescale.nets.caffe_file import check_net_file

INPUT = ('name: "t"\nlayer { name: "data" type: "Input" top: "data" '
         'input_param { shape { dim: 1 dim: 4 dim: 16 dim: 16 } } }\n')
DATA = ('name: "t"\nlayer { name: "data" type: "Data" top: "data" top: "label" transform_param { crop_size: %s } '
        'data_param { source: "x" batch_size: %s } }\n')
OK = "num_output: 4 kernel_size: 3 pad: 1"


def conv(name: str, bottom: str, settings: str) -> str:
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
            f'convolution_param {{ {settings} }} }}\n')


def pool(name: str, bottom: str, settings: str) -> str:
    return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}" '
            f'pooling_param {{ {settings} }} }}\n')


def merge(kind: str, bottoms: tuple[str, ...], settings: str = "") -> str:
    reads = " ".join(f'bottom: "{b}"' for b in bottoms)
    return f'layer {{ name: "m" type: "{kind}" {reads} top: "m" {settings} }}\n'


def head(bottom: str) -> str:
    return (f'layer {{ name: "ip" type: "InnerProduct" bottom: "{bottom}" top: "ip" inner_product_param '
            f'{{ num_output: 10 }} }}\nlayer {{ name: "prob" type: "Softmax" bottom: "ip" top: "prob" }}\n')


def branches(first: str, second: str, kind: str = "Eltwise", settings: str = "") -> str:
    return conv("b1", "data", first) + conv("b2", "data", second) + merge(kind, ("b1", "b2"), settings) + head("m")


def simple(layer: str, top: str) -> str:
    return layer + head(top)


CASES = {
    # (net after the input, the layer named, what the sentence says)
    "zero stride": (simple(conv("c", "data", "num_output: 4 kernel_size: 3 stride: 0"), "c"), "c", "stride is 0"),
    "zero stride in a branch": (branches(OK, OK + " stride: 0"), "b2", "stride is 0; expected 1 or more"),
    "zero stride height": (simple(conv("c", "data", "num_output: 4 kernel_size: 3 stride_h: 0 stride_w: 1"), "c"),
                           "c", r"stride is 0x1 \(height x width\)"),
    "negative stride": (simple(conv("c", "data", "num_output: 4 kernel_size: 3 stride: -1"), "c"), "c",
                        "stride is -1"),
    "zero kernel": (simple(conv("c", "data", "num_output: 4 kernel_size: 0"), "c"), "c", "kernel is 0"),
    "negative kernel": (simple(conv("c", "data", "num_output: 4 kernel_size: -3"), "c"), "c", "kernel is -3"),
    "negative pad": (simple(conv("c", "data", "num_output: 4 kernel_size: 3 pad: -1"), "c"), "c",
                     "pad is -1; expected 0 or more"),
    "zero dilation": (simple(conv("c", "data", "num_output: 4 kernel_size: 3 dilation: 0"), "c"), "c",
                      "dilation is 0"),
    "zero group": (simple(conv("c", "data", "num_output: 4 kernel_size: 3 group: 0"), "c"), "c", "group is 0"),
    "zero group in a branch": (branches(OK, OK + " group: 0"), "b2", "group is 0"),
    "negative group": (simple(conv("c", "data", "num_output: 4 kernel_size: 3 group: -2"), "c"), "c",
                       "group is -2"),
    "group not dividing": (simple(conv("c", "data", "num_output: 6 kernel_size: 3 group: 3"), "c"), "c",
                           "groups=3 must divide its 4 input and 6 output channels"),
    "negative outputs": (simple(conv("c", "data", "num_output: -4 kernel_size: 3"), "c"), "c", "num_output is -4"),
    "kernel larger than input": (simple(conv("c", "data", "num_output: 4 kernel_size: 99"), "c"), "c",
                                 "its input 16x16 is too small for its 99x99 kernel"),
    "zero pooling stride": (simple(pool("p", "data", "pool: MAX kernel_size: 2 stride: 0"), "p"), "p",
                            "stride is 0"),
    "zero pooling stride in a branch": (conv("b1", "data", OK) + pool("b2", "data", "kernel_size: 3 stride: 0 pad: 1")
                                        + merge("Concat", ("b1", "b2")) + head("m"), "b2", "stride is 0"),
    "zero pooling kernel": (simple(pool("p", "data", "pool: MAX kernel_size: 0"), "p"), "p", "kernel is 0"),
    "pooling pad as large as its kernel": (simple(pool("p", "data", "kernel_size: 2 pad: 2"), "p"), "p",
                                           r"pad \(2, 2\) is not smaller than the kernel"),
    "pooling larger than input": (simple(pool("p", "data", "kernel_size: 40 stride: 1"), "p"), "p",
                                  r"input \(16, 16, 4\) is too small \(output would be \(-23, -23, 4\)\)"),
    "global pooling with a stride": (simple(pool("p", "data", "pool: AVE global_pooling: true stride: 2"), "p"), "p",
                                     "global_pooling covers the whole input"),
    "eltwise of other shapes": (branches(OK, "num_output: 4 kernel_size: 3"), "m",
                                r"branch 1 gives \(14, 14, 4\) but branch 0 gives \(16, 16, 4\)"),
    "eltwise of other channels": (branches(OK, "num_output: 8 kernel_size: 3 pad: 1"), "m",
                                  r"branch 1 gives \(16, 16, 8\)"),
    "eltwise of one blob": (conv("c", "data", OK) + merge("Eltwise", ("c",)) + head("m"), "m",
                            r"reads 1 blob\(s\); an Eltwise layer combines two or more"),
    "eltwise coeffs not one per bottom": (branches(OK, OK, settings="eltwise_param { coeff: 1 coeff: 1 coeff: 1 }"),
                                          "m", "gives 3 coeff values for 2 bottoms"),
    "eltwise product with coeffs": (branches(OK, OK, settings="eltwise_param { operation: PROD coeff: 1 coeff: 2 }"),
                                    "m", "and only with SUM"),
    "concat of one blob": (conv("c", "data", OK) + merge("Concat", ("c",)) + head("m"), "m",
                           r"reads 1 blob\(s\); firescale takes a Concat as the merge of two or more branches"),
    "concat of other sizes": (branches(OK, "num_output: 4 kernel_size: 3", "Concat"), "m",
                              r"branch 1 gives \(14, 14\) but branch 0 gives \(16, 16\)"),
    "split of nothing": ('layer { name: "s" type: "Split" top: "a" top: "b" }\n' + head("a"), "s",
                         "a Split copies exactly one bottom"),
    "even LRN window": (simple('layer { name: "n" type: "LRN" bottom: "data" top: "n" lrn_param { local_size: 4 } }\n',
                               "n"), "n", "local_size is 4; expected an odd number"),
    "dropout of everything": (simple('layer { name: "d" type: "Dropout" bottom: "data" top: "d" '
                                     'dropout_param { dropout_ratio: 1.0 } }\n', "d"), "d", "dropout_ratio is 1.0"),
    "batch norm without eps": (simple('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "data" '
                                      'batch_norm_param { eps: 0 } }\n', "data"), "bn", "expected eps above 0"),
    "accuracy of the top 0": (conv("c", "data", OK) + head("c") + 'layer { name: "acc" type: "Accuracy" bottom: "ip" '
                              'bottom: "data" top: "acc" accuracy_param { top_k: 0 } }\n', "acc", "top_k is 0"),
    "a zero input dim": ('name: "t"\nlayer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 '
                         'dim: 0 dim: 16 dim: 16 } } }\n' + head("data"), "data", "expected four, each 1 or more"),
    "a negative crop": (DATA % (-4, 4) + head("data"), "data", "crop_size is -4"),
    "a negative batch": (DATA % (8, -4) + head("data"), "data", "batch_size is -4"),
}


def net_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "impossible.prototxt"
    path.write_text(body if body.startswith("name:") else INPUT + body)
    return path


@pytest.mark.parametrize("case", CASES)
def test_predict_layers_names_the_impossible_layer(case, tmp_path, capsys):
    body, layer, sentence = CASES[case]
    path = net_file(tmp_path, body)
    assert main(["predict", "layers", "--net", str(path), "--batch", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"firescale: error: {path}: "), err
    assert re.search(rf"(layer|block) '{layer}'", err) and re.search(sentence, err), err


@pytest.mark.parametrize("case", CASES)
def test_planning_a_sweep_with_the_net_names_the_impossible_layer(case, tmp_path):
    body, layer, sentence = CASES[case]
    path = net_file(tmp_path, body)
    with pytest.raises(FirescaleError) as raised:
        check_net_file(path, input_shape=(16, 16, 4) if "Data" in body else None)
    message = str(raised.value)
    assert str(path) in message and re.search(rf"(layer|block) '{layer}'", message) and re.search(sentence, message)
