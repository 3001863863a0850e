"""The trainer's blobs in Caffe's layouts and back: OIHW kernels, InnerProduct rows over C,H,W, by layer name.

The trainer keeps NHWC activations: convolution kernels HWIO (kh, kw, in/group, out) and InnerProduct
weights (in, out) with `in` flattened in H, W, C order.  Caffe keeps kernels OIHW (out, in/group, kh,
kw) and InnerProduct weights (out, in) with `in` flattened in C, H, W order.  Both group a grouped
convolution's filters the same way (output channels in group order), so each conversion is a pure
permutation of the float32 values: no arithmetic, exact both ways.  A kernel may be rectangular (kh, kw);
a layer without a bias (bias_term: false) has one blob.  BatchNorm's three blobs (mean, variance, the
moving-average factor) and Scale's one or two (scale, bias) are vectors, the same in both.

A layer keeps Caffe's name: a layer inside a block of a net read from a Caffe file is named in the
trainer `block/layer`; its Caffe name is that when the file has it (GoogLeNet's `inception_3a/1x1`),
else the layer's own (ResNet's `res2a_branch1` inside block `res2a`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from firescale.caffe.caffemodel import Blobs
from firescale.errors import FirescaleError
from firescale.nets.spec import FC, BatchNorm, Conv, NetSpec, Scale, Shape, infer_shapes

LAYER_TYPES = {Conv: "Convolution", FC: "InnerProduct", BatchNorm: "BatchNorm", Scale: "Scale"}
# Caffe's blobs of each layer kind with learnt (BatchNorm: stored) values, in Caffe's order; the trainer's too.
BLOB_NAMES: dict[type, tuple[str, ...]] = {Conv: ("weights", "bias"), FC: ("weights", "bias"),
                                           BatchNorm: ("mean", "variance", "factor"), Scale: ("scale", "bias")}


@dataclass(frozen=True)
class BlobLayout:
    """One learnable blob as the trainer keeps it and as Caffe does."""

    layer: str                   # Caffe's layer name
    index: int                   # Caffe's blob index: 0 weights, 1 bias (BatchNorm: mean, variance, factor)
    trainer_shape: tuple[int, ...]
    caffe_shape: tuple[int, ...]
    flat_input: Shape | None = None   # the (H, W, C) an InnerProduct's weights flatten; None otherwise
    blob: str = "weights"        # the blob's name: weights, bias, mean, variance, factor, scale
    record: str = ""             # the trainer's layer name (block/layer), when it differs from Caffe's

    @property
    def param(self) -> str:
        """The trainer's parameter name, e.g. `conv1/weights`, `bn_conv1/mean`."""
        return f"{self.record or self.layer}/{self.blob}"


def caffe_names(spec: NetSpec) -> dict[str, str]:
    """The trainer's name of every layer -> Caffe's name of it (see the module's note)."""
    records = infer_shapes(spec)
    if not spec.source:
        return {rec.name: rec.name for rec in records}
    in_file = _file_layers(spec.source, {rec.name for rec in records})   # the file read once, not once a layer
    return {rec.name: rec.name if rec.name == rec.layer.name or rec.name in in_file else rec.layer.name
            for rec in records}


def _file_layers(source: str, names: set[str]) -> set[str]:
    """The layer names of the Caffe file `source` among `names` (all of `names` when it cannot be read)."""
    from firescale.caffe.net import read_net

    try:
        return {layer.name for layer in read_net(source).layers} & names
    except FirescaleError:
        return names


def caffe_layouts(spec: NetSpec) -> dict[str, list[BlobLayout]]:
    """Every layer with learnable blobs -> its blobs, in the trainer's (and Caffe's) parameter order."""
    out: dict[str, list[BlobLayout]] = {}
    names = caffe_names(spec)
    for rec in infer_shapes(spec):
        layer, (h, w, c) = rec.layer, rec.input_shape
        name = names[rec.name]
        record = "" if name == rec.name else rec.name
        if name in out:
            raise FirescaleError(f"net {spec.name!r}: two layers with blobs are named {name!r}; Caffe's weights "
                                 f"name each layer once")
        blobs: list[tuple[tuple[int, ...], tuple[int, ...], Shape | None]] = []
        if isinstance(layer, Conv):
            (kh, kw), per_group = layer.kernel_hw, c // layer.groups
            blobs = [((kh, kw, per_group, layer.out), (layer.out, per_group, kh, kw), None)]
            blobs += [((layer.out,), (layer.out,), None)] if layer.bias else []
        elif isinstance(layer, FC):
            blobs = [((h * w * c, layer.out), (layer.out, c * h * w), (h, w, c))]
            blobs += [((layer.out,), (layer.out,), None)] if layer.bias else []
        elif isinstance(layer, BatchNorm):
            blobs = [((c,), (c,), None), ((c,), (c,), None), ((1,), (1,), None)]
        elif isinstance(layer, Scale):
            blobs = [((c,), (c,), None)] * (1 + layer.bias)
        if blobs:
            out[name] = [BlobLayout(name, i, t, cs, flat, BLOB_NAMES[type(layer)][i], record)
                         for i, (t, cs, flat) in enumerate(blobs)]
    return out


def layer_types(spec: NetSpec) -> dict[str, str]:
    """Caffe's type of every layer with blobs (Convolution, InnerProduct, BatchNorm, Scale), by Caffe's name."""
    names = caffe_names(spec)
    return {names[rec.name]: LAYER_TYPES[type(rec.layer)] for rec in infer_shapes(spec)
            if type(rec.layer) in LAYER_TYPES}


def to_caffe(layout: BlobLayout, array: np.ndarray) -> np.ndarray:
    """A trainer array in Caffe's layout (a permutation of its values)."""
    if len(layout.trainer_shape) == 4:                  # HWIO -> OIHW
        return np.ascontiguousarray(array.transpose(3, 2, 0, 1))
    if layout.flat_input is not None:                   # (H*W*C, out) -> (out, C*H*W)
        h, w, c = layout.flat_input
        out = layout.caffe_shape[0]
        return np.ascontiguousarray(array.reshape(h, w, c, out).transpose(3, 2, 0, 1)).reshape(out, c * h * w)
    return np.ascontiguousarray(array)


def from_caffe(layout: BlobLayout, array: np.ndarray) -> np.ndarray:
    """A Caffe array (in `layout.caffe_shape`) in the trainer's layout; the exact inverse of `to_caffe`."""
    array = array.reshape(layout.caffe_shape)
    if len(layout.trainer_shape) == 4:                  # OIHW -> HWIO
        return np.ascontiguousarray(array.transpose(2, 3, 1, 0))
    if layout.flat_input is not None:                   # (out, C*H*W) -> (H*W*C, out)
        h, w, c = layout.flat_input
        out = layout.caffe_shape[0]
        return np.ascontiguousarray(array.reshape(out, c, h, w).transpose(2, 3, 1, 0)).reshape(h * w * c, out)
    return np.ascontiguousarray(array)


def net_to_caffe(spec: NetSpec, weights: dict[str, np.ndarray]) -> Blobs:
    """The trainer's weights ({param name: array}) as Caffe's {layer: [blobs]}."""
    return {layer: [to_caffe(b, weights[b.param]) for b in blobs] for layer, blobs in caffe_layouts(spec).items()}


@dataclass
class CopiedWeights:
    """The outcome of copying a weights file into a net by layer name, as Caffe's CopyTrainedLayersFrom."""

    weights: dict[str, np.ndarray] = field(default_factory=dict)   # param name -> trainer array
    copied: list[str] = field(default_factory=list)      # the net's layers found in the file
    kept: list[str] = field(default_factory=list)        # the net's layers not in the file (keep their fillers)
    ignored: list[str] = field(default_factory=list)     # the file's layers with blobs the net does not have


def _fits(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Caffe's ShapeEquals: the same shape, or the old 4-D num/channels/height/width of it."""
    return got == want or (len(got) == 4 and len(want) <= 4 and got == (1,) * (4 - len(want)) + want)


def net_from_caffe(spec: NetSpec, blobs: Blobs, source: str | Path) -> CopiedWeights:
    """Caffe's blobs in the trainer's layout, layer by layer name; a blob of another shape is refused."""
    result = CopiedWeights()
    layouts = caffe_layouts(spec)
    for layer, layer_layouts in layouts.items():
        if layer not in blobs:
            result.kept.append(layer)
            continue
        found = blobs[layer]
        if len(found) != len(layer_layouts):
            what = ", ".join(b.blob for b in layer_layouts)
            raise FirescaleError(f"{source}: layer {layer!r} has {len(found)} blobs, but the net's {layer!r} has "
                                 f"{len(layer_layouts)} ({what})")
        for layout, array in zip(layer_layouts, found):
            if not _fits(tuple(array.shape), layout.caffe_shape):
                raise FirescaleError(f"{source}: layer {layer!r} blob {layout.index} ({layout.blob}) "
                                     f"has shape {tuple(array.shape)}, but net {spec.name!r} expects "
                                     f"{layout.caffe_shape}; rename the layer to learn it from its filler instead")
            # Caffe's FromProto casts double_data to the net's float type; float32 blobs copy exactly.
            result.weights[layout.param] = from_caffe(layout, array.astype(np.float32, copy=False))
        result.copied.append(layer)
    result.ignored = [name for name, found in blobs.items() if found and name not in layouts]
    return result
