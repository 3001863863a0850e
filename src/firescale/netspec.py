"""Framework-neutral network definitions (layers, initialisations, shapes) shared by trainer and model."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Union

from .errors import FirescaleError

Shape = tuple[int, int, int]  # (H, W, C) of one image's activations


@dataclass(frozen=True)
class Init:
    """A weight or bias initialiser as Caffe names it: gaussian(std), xavier, msra, constant(value)."""

    kind: Literal["gaussian", "xavier", "msra", "constant"]
    std: float = 0.0
    value: float = 0.0


def gaussian(std: float) -> Init:
    return Init("gaussian", std=std)


def constant(value: float) -> Init:
    return Init("constant", value=value)


XAVIER = Init("xavier")
ZERO = constant(0.0)


@dataclass(frozen=True)
class Conv:
    """Convolution with `out` filters of kernel x kernel; `groups` splits channels as Caffe's `group`."""

    name: str
    out: int
    kernel: int
    stride: int = 1
    pad: int = 0
    groups: int = 1
    weight_init: Init = XAVIER
    bias_init: Init = ZERO


@dataclass(frozen=True)
class Pool:
    """Max or average pooling; Caffe rounds the output size up (`ceil`), `global_pool` covers H x W."""

    name: str
    mode: Literal["max", "avg"]
    kernel: int = 2
    stride: int = 2
    pad: int = 0
    global_pool: bool = False
    rounding: Literal["ceil", "floor"] = "ceil"


@dataclass(frozen=True)
class LRN:
    """Local response normalisation across channels (Caffe ACROSS_CHANNELS)."""

    name: str
    local_size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 1.0


@dataclass(frozen=True)
class ReLU:
    name: str


@dataclass(frozen=True)
class Dropout:
    name: str
    rate: float = 0.5


@dataclass(frozen=True)
class FC:
    """Fully-connected (Caffe InnerProduct) layer; flattens its input."""

    name: str
    out: int
    weight_init: Init = XAVIER
    bias_init: Init = ZERO


InnerProduct = FC


@dataclass(frozen=True)
class Inception:
    """Parallel branches over the same input whose outputs are concatenated along channels."""

    name: str
    branches: tuple[tuple["Layer", ...], ...]


@dataclass(frozen=True)
class Softmax:
    """Softmax with cross-entropy loss over `num_classes` outputs (Caffe SoftmaxWithLoss)."""

    name: str = "loss"


Layer = Union[Conv, Pool, LRN, ReLU, Dropout, FC, Inception, Softmax]


@dataclass(frozen=True)
class NetSpec:
    """A whole network: its name, input (H, W, C), number of classes, layers and initialisation scheme."""

    name: str
    input_shape: Shape
    num_classes: int
    layers: tuple[Layer, ...]
    init: str = ""


@dataclass(frozen=True)
class LayerShape:
    """One (flattened) layer with the shape it reads and the shape it writes, per image."""

    name: str
    layer: Layer
    input_shape: Shape
    output_shape: Shape


def conv_output_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def pool_output_size(size: int, pool: Pool) -> int:
    """Output size along one axis with Caffe's rules (ceil rounding, last window starts inside)."""
    if pool.global_pool:
        return 1
    span = size + 2 * pool.pad - pool.kernel
    if pool.rounding == "ceil":
        out = int(math.ceil(span / pool.stride)) + 1
        if pool.pad and (out - 1) * pool.stride >= size + pool.pad:
            out -= 1
    else:
        out = span // pool.stride + 1
    return out


def pool_extra_padding(size: int, pool: Pool) -> int:
    """Cells to add after the end of an axis so that a floor-rounding framework gets Caffe's size."""
    if pool.global_pool:
        return 0
    out = pool_output_size(size, pool)
    return max(0, (out - 1) * pool.stride + pool.kernel - (size + 2 * pool.pad))


def _layer_shapes(layers: tuple[Layer, ...], shape: Shape, num_classes: int,
                  prefix: str, spec_name: str) -> tuple[list[LayerShape], Shape]:
    records: list[LayerShape] = []
    for layer in layers:
        h, w, c = shape
        name = prefix + layer.name
        if isinstance(layer, Conv):
            if c % layer.groups or layer.out % layer.groups:
                raise FirescaleError(f"net {spec_name!r} layer {name!r}: groups={layer.groups} must divide "
                                     f"its {c} input and {layer.out} output channels")
            out = (conv_output_size(h, layer.kernel, layer.stride, layer.pad),
                   conv_output_size(w, layer.kernel, layer.stride, layer.pad), layer.out)
        elif isinstance(layer, Pool):
            out = (pool_output_size(h, layer), pool_output_size(w, layer), c)
        elif isinstance(layer, FC):
            out = (1, 1, layer.out)
        elif isinstance(layer, Inception):
            channels = 0
            branch_out: Shape | None = None
            for i, branch in enumerate(layer.branches):
                sub, branch_out_i = _layer_shapes(branch, shape, num_classes, name + "/", spec_name)
                records.extend(sub)
                if branch_out is not None and branch_out_i[:2] != branch_out[:2]:
                    raise FirescaleError(f"net {spec_name!r} inception {name!r}: branch {i} gives "
                                         f"{branch_out_i[:2]} but an earlier branch gives {branch_out[:2]}")
                branch_out = branch_out_i
                channels += branch_out_i[2]
            assert branch_out is not None
            out = (branch_out[0], branch_out[1], channels)
        else:  # LRN, ReLU, Dropout, Softmax keep the shape
            out = shape
        if min(out) < 1:
            raise FirescaleError(f"net {spec_name!r} layer {name!r}: input {shape} is too small "
                                 f"(output would be {out}); use a larger input_shape")
        records.append(LayerShape(name, layer, shape, out))
        shape = out
    return records, shape


def infer_shapes(spec: NetSpec) -> list[LayerShape]:
    """Per-layer input and output shapes (H, W, C) of one image; inception branches come first, flattened."""
    records, final = _layer_shapes(spec.layers, spec.input_shape, spec.num_classes, "", spec.name)
    if final[2] != spec.num_classes:
        raise FirescaleError(f"net {spec.name!r}: the last layer gives {final[2]} outputs but "
                             f"num_classes is {spec.num_classes}")
    return records


# ---------------------------------------------------------------- the networks


def _lenet(num_classes: int) -> tuple[Layer, ...]:
    # Caffe's LeNet with "same" padding in the convolutions so that 8x8 digits fit as well as 28x28.
    return (
        Conv("conv1", 20, 5, pad=2), Pool("pool1", "max", 2, 2),
        Conv("conv2", 50, 5, pad=2), Pool("pool2", "max", 2, 2),
        FC("ip1", 500), ReLU("relu1"), FC("ip2", num_classes), Softmax(),
    )


def _nin(num_classes: int) -> tuple[Layer, ...]:
    # NiN for ImageNet (Lin et al., Caffe model zoo); FireCaffe 7.1: std 0.01 for 1x1, 0.05 otherwise, bias 0.
    def block(i: int, conv: Conv, cccp: tuple[int, int]) -> tuple[Layer, ...]:
        a, b = cccp
        return (conv, ReLU(f"relu{i}"),
                Conv(f"cccp{2 * i - 1}", a, 1, weight_init=gaussian(0.01)), ReLU(f"relu{i}a"),
                Conv(f"cccp{2 * i}", b, 1, weight_init=gaussian(0.01)), ReLU(f"relu{i}b"))
    g = gaussian(0.05)
    return (
        *block(1, Conv("conv1", 96, 11, stride=4, weight_init=g), (96, 96)), Pool("pool1", "max", 3, 2),
        *block(2, Conv("conv2", 256, 5, pad=2, weight_init=g), (256, 256)), Pool("pool2", "max", 3, 2),
        *block(3, Conv("conv3", 384, 3, pad=1, weight_init=g), (384, 384)), Pool("pool3", "max", 3, 2),
        Dropout("drop"),
        *block(4, Conv("conv4-1024", 1024, 3, pad=1, weight_init=g), (1024, num_classes)),
        Pool("pool4", "avg", global_pool=True), Softmax(),
    )


def _alexnet(num_classes: int) -> tuple[Layer, ...]:
    # Caffe's bvlc_alexnet: gaussian 0.01 (fc6/fc7 0.005), biases 0 or 0.1, two groups in conv2/4/5.
    g, b1 = gaussian(0.01), constant(0.1)
    return (
        Conv("conv1", 96, 11, stride=4, weight_init=g), ReLU("relu1"), LRN("norm1"), Pool("pool1", "max", 3, 2),
        Conv("conv2", 256, 5, pad=2, groups=2, weight_init=g, bias_init=b1), ReLU("relu2"), LRN("norm2"),
        Pool("pool2", "max", 3, 2),
        Conv("conv3", 384, 3, pad=1, weight_init=g), ReLU("relu3"),
        Conv("conv4", 384, 3, pad=1, groups=2, weight_init=g, bias_init=b1), ReLU("relu4"),
        Conv("conv5", 256, 3, pad=1, groups=2, weight_init=g, bias_init=b1), ReLU("relu5"),
        Pool("pool5", "max", 3, 2),
        FC("fc6", 4096, gaussian(0.005), b1), ReLU("relu6"), Dropout("drop6"),
        FC("fc7", 4096, gaussian(0.005), b1), ReLU("relu7"), Dropout("drop7"),
        FC("fc8", num_classes, g), Softmax(),
    )


def _inception(name: str, c1: int, r3: int, c3: int, r5: int, c5: int, proj: int) -> Inception:
    b = constant(0.2)

    def conv(n: str, out: int, k: int) -> tuple[Layer, ...]:
        return (Conv(n, out, k, pad=k // 2, bias_init=b), ReLU(f"relu_{n}"))
    return Inception(name, (
        conv("1x1", c1, 1),
        conv("3x3_reduce", r3, 1) + conv("3x3", c3, 3),
        conv("5x5_reduce", r5, 1) + conv("5x5", c5, 5),
        (Pool("pool", "max", 3, 1, pad=1),) + conv("pool_proj", proj, 1),
    ))


def _googlenet(num_classes: int) -> tuple[Layer, ...]:
    # Inception v1 as bvlc_googlenet, without the two auxiliary classifiers; FireCaffe 7.1: xavier, bias 0.2.
    b = constant(0.2)
    return (
        Conv("conv1/7x7_s2", 64, 7, stride=2, pad=3, bias_init=b), ReLU("conv1/relu"),
        Pool("pool1/3x3_s2", "max", 3, 2), LRN("pool1/norm1"),
        Conv("conv2/3x3_reduce", 64, 1, bias_init=b), ReLU("conv2/relu_reduce"),
        Conv("conv2/3x3", 192, 3, pad=1, bias_init=b), ReLU("conv2/relu"), LRN("conv2/norm2"),
        Pool("pool2/3x3_s2", "max", 3, 2),
        _inception("inception_3a", 64, 96, 128, 16, 32, 32),
        _inception("inception_3b", 128, 128, 192, 32, 96, 64),
        Pool("pool3/3x3_s2", "max", 3, 2),
        _inception("inception_4a", 192, 96, 208, 16, 48, 64),
        _inception("inception_4b", 160, 112, 224, 24, 64, 64),
        _inception("inception_4c", 128, 128, 256, 24, 64, 64),
        _inception("inception_4d", 112, 144, 288, 32, 64, 64),
        _inception("inception_4e", 256, 160, 320, 32, 128, 128),
        Pool("pool4/3x3_s2", "max", 3, 2),
        _inception("inception_5a", 256, 160, 320, 32, 128, 128),
        _inception("inception_5b", 384, 192, 384, 48, 128, 128),
        Pool("pool5/7x7_s1", "avg", global_pool=True), Dropout("pool5/drop", 0.4),
        FC("loss3/classifier", num_classes, XAVIER, ZERO), Softmax(),
    )


def _vgg19(num_classes: int) -> tuple[Layer, ...]:
    # VGG-19 (configuration E); xavier weights and zero biases (Caffe's usual choice for training it).
    layers: list[Layer] = []
    for stage, (width, count) in enumerate(((64, 2), (128, 2), (256, 4), (512, 4), (512, 4)), start=1):
        for i in range(1, count + 1):
            layers += [Conv(f"conv{stage}_{i}", width, 3, pad=1), ReLU(f"relu{stage}_{i}")]
        layers.append(Pool(f"pool{stage}", "max", 2, 2))
    layers += [FC("fc6", 4096), ReLU("relu6"), Dropout("drop6"),
               FC("fc7", 4096), ReLU("relu7"), Dropout("drop7"), FC("fc8", num_classes), Softmax()]
    return tuple(layers)


_NETS = {
    # name: (builder, default input (H, W, C), default classes, initialisation scheme)
    "lenet": (_lenet, (28, 28, 1), 10, "xavier weights, zero biases (Caffe LeNet)"),
    "nin": (_nin, (224, 224, 3), 1000, "gaussian std 0.01 for 1x1 and 0.05 for others, zero biases "
                                       "(FireCaffe 7.1)"),
    "alexnet": (_alexnet, (227, 227, 3), 1000, "gaussian std 0.01 (fc6/fc7 0.005), biases 0 or 0.1 "
                                               "(bvlc_alexnet)"),
    "googlenet": (_googlenet, (224, 224, 3), 1000, "xavier weights, biases 0.2 (FireCaffe 7.1)"),
    "vgg19": (_vgg19, (224, 224, 3), 1000, "xavier weights, zero biases"),
}

NET_NAMES: tuple[str, ...] = tuple(_NETS)


def get_net(name: str, num_classes: int | None = None, input_shape: Shape | None = None) -> NetSpec:
    """The named network (lenet, nin, alexnet, googlenet, vgg19), optionally for other classes or inputs."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in _NETS:
        raise FirescaleError(f"unknown net {name!r}; known nets: {', '.join(NET_NAMES)}")
    builder, default_shape, default_classes, init = _NETS[key]
    classes = default_classes if num_classes is None else int(num_classes)
    if classes < 1:
        raise FirescaleError(f"net {name!r}: num_classes must be at least 1, not {num_classes}")
    shape = tuple(int(x) for x in (default_shape if input_shape is None else input_shape))
    if len(shape) != 3:
        raise FirescaleError(f"net {name!r}: input_shape must be (H, W, C), not {input_shape!r}")
    spec = NetSpec(key, shape, classes, builder(classes), init)  # type: ignore[arg-type]
    infer_shapes(spec)  # fail now, with the layer named, if the input is too small
    return spec


def with_input(spec: NetSpec, input_shape: Shape) -> NetSpec:
    """The same network reading another input shape."""
    out = replace(spec, input_shape=tuple(input_shape))
    infer_shapes(out)
    return out
