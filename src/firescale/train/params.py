"""A net's blobs as every backend keeps them: their names and shapes in the trainer's layout, and Caffe's fillers.

The trainer's layout (HWIO kernels, InnerProduct weights (in, out) over H, W, C) is the one snapshots and
Caffe's weights convert from (`firescale.train.caffe_weights`); a backend that keeps its blobs otherwise (PyTorch:
Caffe's own OIHW) converts at its edge, so that both draw the same numbers from the same seed.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from firescale.nets.spec import (
    FC,
    BatchNorm,
    Branches,
    Conv,
    Flatten,
    Init,
    Layer,
    NetSpec,
    Pool,
    Scale,
    Shape,
    constant,
    pool_output_size,
)
from firescale.train.caffe_weights import BLOB_NAMES

MOVING_AVERAGE_FRACTION = 0.999   # Caffe's BatchNormParameter default
STATISTICS = ("mean", "variance", "factor")   # BatchNorm's blobs: stored, never learnt


@dataclass(frozen=True)
class ParamInfo:
    """One blob of a layer: its layer, which blob (weights, bias; BatchNorm's mean, variance, factor; Scale's
    scale, bias), its index among the layer's blobs in Caffe's order, and its shape."""

    layer: str
    blob: str
    shape: tuple[int, ...]
    index: int = 0

    @property
    def name(self) -> str:
        return f"{self.layer}/{self.blob}"


def fill(init: Init, shape: tuple[int, ...], fan_in: int, rng: np.random.Generator) -> np.ndarray:
    """Caffe's fillers: gaussian(std), xavier (uniform +-sqrt(3/fan_in)), msra (std sqrt(2/fan_in)), constant."""
    if init.kind == "gaussian":
        return rng.normal(0.0, init.std, size=shape).astype(np.float32)
    if init.kind == "xavier":
        scale = math.sqrt(3.0 / fan_in)
        return rng.uniform(-scale, scale, size=shape).astype(np.float32)
    if init.kind == "msra":
        return rng.normal(0.0, math.sqrt(2.0 / fan_in), size=shape).astype(np.float32)
    if init.kind == "constant":
        return np.full(shape, init.value, dtype=np.float32)
    raise ValueError(f"unknown filler {init.kind!r}")


def initial_blobs(spec: NetSpec, seed: int) -> Iterator[tuple[str, ParamInfo, np.ndarray]]:
    """Every blob of `spec` in Caffe's order, with its value drawn from its filler by one NumPy generator seeded
    `seed`, in the trainer's layout: (the top-level layer it belongs to, its ParamInfo, its float32 value).
    Both backends build their nets from these, so one seed gives both the same weights."""
    rng = np.random.default_rng(seed)
    shape = spec.input_shape
    for layer in spec.layers:
        out: list[tuple[ParamInfo, np.ndarray]] = []
        shape = _layer_blobs((layer,), shape, "", rng, out)
        for info, value in out:
            yield layer.name, info, value


def _blobs(layer: Layer, name: str, shapes: Sequence[tuple[int, ...]], inits: Sequence[Init], fan_in: int,
           rng: np.random.Generator, out: list[tuple[ParamInfo, np.ndarray]]) -> None:
    for index, (blob, shape, init) in enumerate(zip(BLOB_NAMES[type(layer)], shapes, inits)):
        out.append((ParamInfo(name, blob, shape, index), fill(init, shape, fan_in, rng)))


def _layer_blobs(layers: tuple[Layer, ...], shape: Shape, prefix: str, rng: np.random.Generator,
                 out: list[tuple[ParamInfo, np.ndarray]]) -> Shape:
    """The blobs of `layers` (inception branches and residual blocks within) and the shape they output."""
    for layer in layers:
        h, w, c = shape
        name = prefix + layer.name
        if isinstance(layer, Conv):
            per_group = c // layer.groups
            (kh, kw), (eh, ew) = layer.kernel_hw, layer.extent_hw
            (sh, sw), (ph, pw) = layer.stride_hw, layer.pad_hw
            wshape = (kh, kw, per_group, layer.out)
            _blobs(layer, name, [wshape, (layer.out,)][:1 + layer.bias], [layer.weight_init, layer.bias_init],
                   per_group * kh * kw, rng, out)
            shape = ((h + 2 * ph - eh) // sh + 1, (w + 2 * pw - ew) // sw + 1, layer.out)
        elif isinstance(layer, FC):
            fan_in = h * w * c
            _blobs(layer, name, [(fan_in, layer.out), (layer.out,)][:1 + layer.bias],
                   [layer.weight_init, layer.bias_init], fan_in, rng, out)
            shape = (1, 1, layer.out)
        elif isinstance(layer, BatchNorm):  # Caffe's blobs start at zero
            _blobs(layer, name, [(c,), (c,), (1,)], [constant(0.0)] * 3, c, rng, out)
        elif isinstance(layer, Scale):      # ScaleParameter's default fillers: scale 1, bias 0
            _blobs(layer, name, [(c,), (c,)][:1 + layer.bias], [constant(1.0), constant(0.0)], c, rng, out)
        elif isinstance(layer, Flatten):
            shape = (1, 1, h * w * c)
        elif isinstance(layer, Pool):
            shape = (pool_output_size(h, layer), pool_output_size(w, layer), c)
        elif isinstance(layer, Branches):
            outs = [_layer_blobs(branch, shape, name + "/", rng, out) for branch in layer.branches]
            shape = (outs[0][0], outs[0][1], sum(o[2] for o in outs)) if layer.merge == "concat" else outs[0]
    return shape
