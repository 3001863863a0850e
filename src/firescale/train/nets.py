"""TensorFlow models built from firescale.nets.spec with Caffe's layer semantics and fillers."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from firescale.errors import FirescaleError
from firescale.nets.spec import (
    FC,
    LRN,
    Branches,
    Conv,
    Dropout,
    Inception,
    Init,
    Layer,
    NetSpec,
    Pool,
    ReLU,
    Softmax,
    pool_extra_padding,
    pool_output_size,
)
from firescale.train.placement import boundary_copy


@dataclass(frozen=True)
class ParamInfo:
    """One learnable blob: its layer, which blob (weights or bias) and its shape."""

    layer: str
    blob: str  # "weights" | "bias"
    shape: tuple[int, ...]

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


def check_trainable(spec: NetSpec) -> None:
    """Refuse, in one sentence naming the layer and its kind, a layer this trainer cannot build yet."""
    def walk(layers: tuple[Layer, ...], prefix: str) -> None:
        for layer in layers:
            name, kind = prefix + layer.name, type(layer).__name__
            if isinstance(layer, Branches):
                if layer.merge != "concat":
                    kind = f"Eltwise {layer.merge.upper()}"
                else:
                    for branch in layer.branches:
                        walk(branch, name + "/")
                    continue
            elif isinstance(layer, (Conv, FC)) and not layer.bias:
                kind += " without a bias (bias_term: false)"
            elif isinstance(layer, Conv) and not layer.square:
                (kh, kw), (sh, sw), (ph, pw) = layer.kernel_hw, layer.stride_hw, layer.pad_hw
                kind = (f"Conv with kernel {kh}x{kw}, stride {sh}x{sw}, pad {ph}x{pw} and dilation "
                        f"{layer.dilation} (it builds one size for both axes, no dilation)")
            elif isinstance(layer, LRN) and layer.within_channel:
                kind = "LRN WITHIN_CHANNEL"
            elif isinstance(layer, (Conv, FC, Pool, ReLU, LRN, Dropout, Softmax)):
                continue
            raise FirescaleError(f"net {spec.name!r} layer {name!r}: the trainer cannot train a {kind} layer yet; "
                                 f"the performance model (predict) takes it")
    walk(spec.layers, "")


class CaffeNet(tf.Module):
    """A NetSpec as a TF module: NHWC inputs, logits out; Caffe's pooling sizes, LRN, grouped conv, dropout."""

    def __init__(self, spec: NetSpec, seed: int, placement: Sequence[str] | None = None) -> None:
        check_trainable(spec)
        # A module's name must be an identifier; a Caffe file's net name may not be one ("ResNet-50").
        super().__init__(name="".join(ch if ch.isalnum() else "_" for ch in spec.name).lstrip("0123456789_") or "net")
        self.spec = spec
        self.infos: list[ParamInfo] = []
        self.params: list[tf.Variable] = []
        self._index: dict[str, int] = {}
        if placement is not None and len(placement) != len(spec.layers):
            raise ValueError(f"net {spec.name!r} has {len(spec.layers)} layers, the placement {len(placement)}")
        # The device of each top-level layer (its weights, its forward pass and, colocated, its backward).
        self.devices = dict(zip((layer.name for layer in spec.layers), placement)) if placement else {}
        rng = np.random.default_rng(seed)
        shape = spec.input_shape
        for layer in spec.layers:
            with tf.device(self.devices.get(layer.name)):
                shape = self._build((layer,), shape, "", rng)

    @property
    def loss_device(self) -> str | None:
        """Where the loss is computed: the device of the last layer (None when the net is not placed)."""
        return self.devices.get(self.spec.layers[-1].name)

    # ------------------------------------------------------------ variables
    def _add(self, info: ParamInfo, value: np.ndarray) -> None:
        self._index[info.name] = len(self.params)
        self.infos.append(info)
        self.params.append(tf.Variable(value, name=info.name.replace("/", "_"), dtype=tf.float32))

    def _build(self, layers: tuple[Layer, ...], shape: tuple[int, int, int], prefix: str,
               rng: np.random.Generator) -> tuple[int, int, int]:
        for layer in layers:
            h, w, c = shape
            name = prefix + layer.name
            if isinstance(layer, Conv):
                per_group = c // layer.groups
                wshape = (layer.kernel, layer.kernel, per_group, layer.out)
                fan_in = per_group * layer.kernel * layer.kernel
                self._add(ParamInfo(name, "weights", wshape), fill(layer.weight_init, wshape, fan_in, rng))
                self._add(ParamInfo(name, "bias", (layer.out,)), fill(layer.bias_init, (layer.out,), fan_in, rng))
                out_h, out_w = ((n + 2 * layer.pad - layer.kernel) // layer.stride + 1 for n in (h, w))
                shape = (out_h, out_w, layer.out)
            elif isinstance(layer, FC):
                fan_in = h * w * c
                wshape = (fan_in, layer.out)
                self._add(ParamInfo(name, "weights", wshape), fill(layer.weight_init, wshape, fan_in, rng))
                self._add(ParamInfo(name, "bias", (layer.out,)), fill(layer.bias_init, (layer.out,), fan_in, rng))
                shape = (1, 1, layer.out)
            elif isinstance(layer, Pool):
                shape = (pool_output_size(h, layer), pool_output_size(w, layer), c)
            elif isinstance(layer, Inception):
                outs = [self._build(branch, shape, name + "/", rng) for branch in layer.branches]
                shape = (outs[0][0], outs[0][1], sum(o[2] for o in outs))
        return shape

    def param(self, name: str) -> tf.Variable:
        return self.params[self._index[name]]

    # ------------------------------------------------------------ forward
    def __call__(self, x: tf.Tensor, training: bool = False, dropout_seed: tf.Tensor | None = None) -> tf.Tensor:
        """Logits of a float32 NHWC batch; dropout (training only) draws from a stateless seed [2] int64."""
        x = self._forward(self.spec.layers, x, "", training, dropout_seed, [0])
        with tf.device(self.loss_device):
            return tf.reshape(x, (tf.shape(x)[0], -1))

    def _forward(self, layers: tuple[Layer, ...], x: tf.Tensor, prefix: str, training: bool,
                 dropout_seed: tf.Tensor | None, counter: list[int]) -> tf.Tensor:
        for layer in layers:
            if isinstance(layer, Softmax):
                break
            device = self.devices.get(layer.name) if not prefix else None
            if device is not None and x.device and _device_index(x.device) != _device_index(device):
                x = boundary_copy(x, x.device, device)  # Caffe's copy layer where the device changes
            # One name scope per layer (nested for inception branches), so that every tensor of the
            # forward pass, and of its gradient, names the layer it belongs to.
            with tf.device(device), tf.name_scope(layer.name):
                x = self._layer(layer, prefix + layer.name, x, training, dropout_seed, counter)
        return x

    def _layer(self, layer: Layer, name: str, x: tf.Tensor, training: bool, dropout_seed: tf.Tensor | None,
               counter: list[int]) -> tf.Tensor:
        if isinstance(layer, Conv):
            return self._conv(layer, name, x)
        if isinstance(layer, FC):
            x = tf.reshape(x, (tf.shape(x)[0], -1))
            x = tf.matmul(x, self.param(name + "/weights")) + self.param(name + "/bias")
            return tf.reshape(x, (tf.shape(x)[0], 1, 1, layer.out))
        if isinstance(layer, Pool):
            return _pool(layer, x)
        if isinstance(layer, ReLU):
            return tf.nn.relu(x)
        if isinstance(layer, LRN):
            return tf.nn.local_response_normalization(x, depth_radius=(layer.local_size - 1) // 2, bias=layer.k,
                                                      alpha=layer.alpha / layer.local_size, beta=layer.beta)
        if isinstance(layer, Dropout):
            counter[0] += 1
            if not (training and layer.rate > 0):
                return x
            if dropout_seed is None:
                raise ValueError(f"layer {name!r}: dropout in training needs a dropout_seed")
            seed = tf.random.experimental.stateless_fold_in(dropout_seed, counter[0])
            keep = tf.random.stateless_uniform(tf.shape(x), seed=seed) >= layer.rate
            return tf.where(keep, x * (1.0 / (1.0 - layer.rate)), tf.zeros_like(x))
        if isinstance(layer, Inception):
            return tf.concat([self._forward(branch, x, name + "/", training, dropout_seed, counter)
                              for branch in layer.branches], axis=-1)
        raise ValueError(f"layer {name!r}: no forward pass for {type(layer).__name__}")

    def _conv(self, layer: Conv, name: str, x: tf.Tensor) -> tf.Tensor:
        if layer.pad:
            x = tf.pad(x, [[0, 0], [layer.pad, layer.pad], [layer.pad, layer.pad], [0, 0]])
        kernel, bias = self.param(name + "/weights"), self.param(name + "/bias")
        strides = (1, layer.stride, layer.stride, 1)
        if layer.groups == 1:
            y = tf.nn.conv2d(x, kernel, strides, "VALID")
        else:  # grouped convolution as Caffe's `group`, one conv per channel group
            xs = tf.split(x, layer.groups, axis=-1)
            ks = tf.split(kernel, layer.groups, axis=-1)
            y = tf.concat([tf.nn.conv2d(a, k, strides, "VALID") for a, k in zip(xs, ks)], axis=-1)
        return y + bias


def _pool(layer: Pool, x: tf.Tensor) -> tf.Tensor:
    h, w = int(x.shape[1]), int(x.shape[2])
    if layer.global_pool:
        return (tf.reduce_max if layer.mode == "max" else tf.reduce_mean)(x, axis=(1, 2), keepdims=True)
    p, k, s = layer.pad, layer.kernel, layer.stride
    eh, ew = pool_extra_padding(h, layer), pool_extra_padding(w, layer)
    paddings = [[0, 0], [p, p + eh], [p, p + ew], [0, 0]]
    if layer.mode == "max":  # Caffe takes the max over the part of the window inside the image
        if p or eh or ew:
            x = tf.pad(x, paddings, constant_values=float("-inf"))
        return tf.nn.max_pool2d(x, k, s, "VALID")
    # Caffe's average divides by the window clipped to the padded image (padding counts, overhang does not).
    if p or eh or ew:
        x = tf.pad(x, paddings)
    summed = tf.nn.avg_pool2d(x, k, s, "VALID") * float(k * k)
    oh, ow = pool_output_size(h, layer), pool_output_size(w, layer)
    rows = np.array([min(i * s - p + k, h + p) - (i * s - p) for i in range(oh)], dtype=np.float32)
    cols = np.array([min(j * s - p + k, w + p) - (j * s - p) for j in range(ow)], dtype=np.float32)
    divisor = np.outer(rows, cols)[None, :, :, None]
    return summed / tf.constant(divisor)


def _device_index(name: str) -> str:
    """'CPU:1' from '/job:localhost/replica:0/task:0/device:CPU:1' or '/CPU:1'."""
    return name.upper().rsplit("DEVICE:", 1)[-1].lstrip("/")


def build_net(spec: NetSpec, seed: int, placement: Sequence[str] | None = None) -> CaffeNet:
    """The TF model of `spec` with weights drawn from Caffe's fillers by a NumPy generator seeded `seed`;
    `placement` names the device of each top-level layer (a net split by layers), None for one device."""
    return CaffeNet(spec, seed, placement)
