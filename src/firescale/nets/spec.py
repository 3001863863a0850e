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
    """Convolution with `out` filters of kernel x kernel; `groups` splits channels as Caffe's `group`.

    `kernel`, `stride` and `pad` hold both axes unless `kernel_w`, `stride_w`, `pad_w` give the width's
    (Caffe's kernel_h/kernel_w); `dilation` spreads the kernel's taps over dilation·(k - 1) + 1 cells.
    """

    name: str
    out: int
    kernel: int
    stride: int = 1
    pad: int = 0
    groups: int = 1
    weight_init: Init = XAVIER
    bias_init: Init = ZERO
    bias: bool = True          # Caffe's bias_term
    kernel_w: int | None = None
    stride_w: int | None = None
    pad_w: int | None = None
    dilation: int = 1

    @property
    def kernel_hw(self) -> tuple[int, int]:
        return self.kernel, self.kernel if self.kernel_w is None else self.kernel_w

    @property
    def stride_hw(self) -> tuple[int, int]:
        return self.stride, self.stride if self.stride_w is None else self.stride_w

    @property
    def pad_hw(self) -> tuple[int, int]:
        return self.pad, self.pad if self.pad_w is None else self.pad_w

    @property
    def extent_hw(self) -> tuple[int, int]:
        """The cells the kernel spans along each axis, dilation included."""
        kh, kw = self.kernel_hw
        return self.dilation * (kh - 1) + 1, self.dilation * (kw - 1) + 1

    @property
    def square(self) -> bool:
        """One kernel, stride and pad for both axes, no dilation: what the trainer builds."""
        return self.kernel_w in (None, self.kernel) and self.stride_w in (None, self.stride) \
            and self.pad_w in (None, self.pad) and self.dilation == 1


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
    """Local response normalisation across channels (Caffe ACROSS_CHANNELS) or, with `within_channel`, over a
    local_size x local_size square of each channel (Caffe WITHIN_CHANNEL)."""

    name: str
    local_size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 1.0
    within_channel: bool = False


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
    bias: bool = True          # Caffe's bias_term


InnerProduct = FC


@dataclass(frozen=True)
class Sigmoid:
    name: str


@dataclass(frozen=True)
class TanH:
    name: str


@dataclass(frozen=True)
class BatchNorm:
    """Caffe's BatchNorm: normalises each channel; it stores a mean, a variance and a scale factor, and
    learns nothing (a Scale layer after it holds the learnt gamma and beta)."""

    name: str
    eps: float = 1e-5
    use_global_stats: bool | None = None    # None: Caffe's default (batch statistics in training)


@dataclass(frozen=True)
class Scale:
    """Caffe's Scale over channels: a learnt factor per channel, and with `bias` a learnt offset."""

    name: str
    bias: bool = False


@dataclass(frozen=True)
class Flatten:
    """Caffe's Flatten: the (H, W, C) of one image as one axis of H*W*C values."""

    name: str


MergeMode = Literal["concat", "sum", "prod", "max"]


@dataclass(frozen=True)
class Branches:
    """Parallel branches over the same input, merged: concatenated along channels (`concat`, an
    inception module) or combined elementwise as Caffe's Eltwise (`sum`, `prod`, `max`).  An empty
    branch is the identity: a residual block's shortcut."""

    name: str
    branches: tuple[tuple[Layer, ...], ...]
    merge: MergeMode = "concat"


Inception = Branches


@dataclass(frozen=True)
class Softmax:
    """Softmax over `num_classes` outputs, with cross-entropy loss (Caffe SoftmaxWithLoss) or, with
    `loss` false, without it (Caffe Softmax: a deploy file's probabilities)."""

    name: str = "loss"
    loss: bool = True


Layer = Conv | Pool | LRN | ReLU | Sigmoid | TanH | Dropout | FC | BatchNorm | Scale | Flatten | Branches | Softmax


@dataclass(frozen=True)
class NetSpec:
    """A whole network: its name, input (H, W, C), number of classes, layers and initialisation scheme."""

    name: str
    input_shape: Shape
    num_classes: int
    layers: tuple[Layer, ...]
    init: str = ""
    source: str = ""                 # the Caffe net file it was read from, if any
    notes: tuple[str, ...] = ()      # what reading that file left out, one sentence each


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


def _check_window(spec_name: str, name: str, shape: Shape, kernel: tuple[int, int], pad: tuple[int, int]) -> None:
    """Refuse a kernel (its extent, dilation included) larger than the padded input, naming the layer."""
    h, w, _ = shape
    (kh, kw), (ph, pw) = kernel, pad
    if kh > h + 2 * ph or kw > w + 2 * pw:
        padding = f"{ph}" if ph == pw else f"{ph}x{pw}"
        raise FirescaleError(f"net {spec_name!r} layer {name!r}: its input {h}x{w} is too small for its "
                             f"{kh}x{kw} kernel (padded by {padding} it is {h + 2 * ph}x{w + 2 * pw}); "
                             f"expected a kernel of at most {h + 2 * ph}x{w + 2 * pw} or a larger input")


def _check_sizes(spec_name: str, name: str, layer: Conv | Pool) -> None:
    """Refuse a window no framework can slide: kernel, stride, dilation or groups below 1, a negative pad."""
    if isinstance(layer, Conv):
        sizes = {"kernel": min(layer.kernel_hw), "stride": min(layer.stride_hw), "dilation": layer.dilation,
                 "groups": layer.groups}
        pad = min(layer.pad_hw)
    else:
        sizes = {} if layer.global_pool else {"kernel": layer.kernel, "stride": layer.stride}
        pad = layer.pad
    for what, value in sizes.items():
        if value < 1:
            raise FirescaleError(f"net {spec_name!r} layer {name!r}: {what} is {value}; expected 1 or more")
    if pad < 0:
        raise FirescaleError(f"net {spec_name!r} layer {name!r}: pad is {pad}; expected 0 or more")


def _merged(spec_name: str, name: str, merge: MergeMode, outs: list[Shape]) -> Shape:
    """The shape that merging branch outputs `outs` gives: concatenated channels, or one shape elementwise."""
    first = outs[0]
    for i, o in enumerate(outs[1:], start=1):
        if merge == "concat" and o[:2] != first[:2]:
            raise FirescaleError(f"net {spec_name!r} block {name!r}: branch {i} gives {o[:2]} but branch 0 "
                                 f"gives {first[:2]}; a concat expects the same height and width")
        if merge != "concat" and o != first:
            raise FirescaleError(f"net {spec_name!r} block {name!r}: branch {i} gives {o} but branch 0 gives "
                                 f"{first}; an elementwise {merge} expects the same shape (H, W, C)")
    if merge == "concat":
        return (first[0], first[1], sum(o[2] for o in outs))
    return first


def _layer_shapes(layers: tuple[Layer, ...], shape: Shape, num_classes: int,
                  prefix: str, spec_name: str) -> tuple[list[LayerShape], Shape]:
    records: list[LayerShape] = []
    for layer in layers:
        h, w, c = shape
        name = prefix + layer.name
        if isinstance(layer, (Conv, Pool)):
            _check_sizes(spec_name, name, layer)
        if isinstance(layer, Conv):
            if c % layer.groups or layer.out % layer.groups:
                raise FirescaleError(f"net {spec_name!r} layer {name!r}: groups={layer.groups} must divide "
                                     f"its {c} input and {layer.out} output channels")
            (eh, ew), (sh, sw), (ph, pw) = layer.extent_hw, layer.stride_hw, layer.pad_hw
            _check_window(spec_name, name, shape, (eh, ew), (ph, pw))
            out = (conv_output_size(h, eh, sh, ph), conv_output_size(w, ew, sw, pw), layer.out)
        elif isinstance(layer, Pool):  # Caffe's ceil rounding lets a pooling window overhang its input
            out = (pool_output_size(h, layer), pool_output_size(w, layer), c)
        elif isinstance(layer, FC):
            out = (1, 1, layer.out)
        elif isinstance(layer, Flatten):
            out = (1, 1, h * w * c)
        elif isinstance(layer, Branches):
            if not layer.branches:
                raise FirescaleError(f"net {spec_name!r} block {name!r} has no branches")
            outs = []
            for branch in layer.branches:
                sub, branch_out = _layer_shapes(branch, shape, num_classes, name + "/", spec_name)
                records.extend(sub)
                outs.append(branch_out)
            out = _merged(spec_name, name, layer.merge, outs)
        else:  # LRN, ReLU, Sigmoid, TanH, Dropout, BatchNorm, Scale, Softmax keep the shape
            out = shape
        if min(out) < 1:
            raise FirescaleError(f"net {spec_name!r} layer {name!r}: input {shape} is too small "
                                 f"(output would be {out}); use a larger input_shape")
        records.append(LayerShape(name, layer, shape, out))
        shape = out
    return records, shape


def output_shape(name: str, input_shape: Shape, layers: tuple[Layer, ...]) -> Shape:
    """The (H, W, C) that `layers` give for one image of `input_shape` (the net named `name` in errors)."""
    return _layer_shapes(layers, input_shape, 0, "", name)[1]


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
