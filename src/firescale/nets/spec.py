"""Framework-neutral network definitions (layers, initialisations, shapes) shared by trainer and model."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from firescale.errors import FirescaleError

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
    branches: tuple[tuple[Layer, ...], ...]


@dataclass(frozen=True)
class Softmax:
    """Softmax with cross-entropy loss over `num_classes` outputs (Caffe SoftmaxWithLoss)."""

    name: str = "loss"


Layer = Conv | Pool | LRN | ReLU | Dropout | FC | Inception | Softmax


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


def with_input(spec: NetSpec, input_shape: Shape) -> NetSpec:
    """The same network reading another input shape."""
    h, w, c = input_shape
    out = replace(spec, input_shape=(h, w, c))
    infer_shapes(out)
    return out
