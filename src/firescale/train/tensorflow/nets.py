"""TensorFlow models built from firescale.nets.spec with Caffe's layer semantics and fillers."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from firescale.errors import FirescaleError
from firescale.nets.spec import (
    FC,
    LRN,
    BatchNorm,
    Branches,
    Conv,
    Dropout,
    Flatten,
    Layer,
    NetSpec,
    Pool,
    ReLU,
    Scale,
    Sigmoid,
    Softmax,
    TanH,
    pool_extra_padding,
    pool_output_size,
)
from firescale.train.params import MOVING_AVERAGE_FRACTION, STATISTICS, ParamInfo, initial_blobs
from firescale.train.tensorflow.placement import boundary_copy


class CaffeNet(tf.Module):
    """A NetSpec as a TF module: NHWC inputs, logits out; Caffe's pooling sizes, LRN (across and within
    channels), grouped and dilated convolution, dropout, BatchNorm (its statistics are blobs, as in
    Caffe), Scale, and concatenated or elementwise merges.

    `params` holds every blob Caffe keeps, BatchNorm's too: Caffe counts them among the learnable
    blobs (with lr_mult 0) and writes them in its .caffemodel and solver history.  BatchNorm updates
    them in the forward pass of training, as Caffe's BatchNormLayer::Forward_cpu does.
    """

    def __init__(self, spec: NetSpec, seed: int, placement: Sequence[str] | None = None,
                 moving_average: Mapping[str, float] | None = None) -> None:
        # A module's name must be an identifier; a Caffe file's net name may not be one ("ResNet-50").
        super().__init__(name="".join(ch if ch.isalnum() else "_" for ch in spec.name).lstrip("0123456789_") or "net")
        self.spec = spec
        self.infos: list[ParamInfo] = []
        self.params: list[tf.Variable] = []
        self._index: dict[str, int] = {}
        self.moving_average = dict(moving_average or {})
        if placement is not None and len(placement) != len(spec.layers):
            raise ValueError(f"net {spec.name!r} has {len(spec.layers)} layers, the placement {len(placement)}")
        # The device of each top-level layer (its weights, its forward pass and, colocated, its backward).
        self.devices = dict(zip((layer.name for layer in spec.layers), placement)) if placement else {}
        for top, info, value in initial_blobs(spec, seed):
            with tf.device(self.devices.get(top)):
                self._add(info, value)

    @property
    def loss_device(self) -> str | None:
        """Where the loss is computed: the device of the last layer (None when the net is not placed)."""
        return self.devices.get(self.spec.layers[-1].name)

    # ------------------------------------------------------------ variables
    def _add(self, info: ParamInfo, value: np.ndarray) -> None:
        if info.name in self._index:
            raise FirescaleError(f"net {self.spec.name!r}: two layers are named {info.layer!r}; the trainer keeps "
                                 f"blobs by layer name (expected each name once)")
        self._index[info.name] = len(self.params)
        self.infos.append(info)
        self.params.append(tf.Variable(value, name=info.name.replace("/", "_"), dtype=tf.float32))

    def param(self, name: str) -> tf.Variable:
        return self.params[self._index[name]]

    @property
    def learnt(self) -> list[bool]:
        """Per blob: whether it is learnt (not one of BatchNorm's statistics, which training keeps itself)."""
        return [info.blob not in STATISTICS for info in self.infos]

    @property
    def statistics(self) -> list[tf.Variable]:
        """BatchNorm's blobs (mean, variance, factor): kept by the forward pass of training, not learnt."""
        return [p for p, learnt in zip(self.params, self.learnt) if not learnt]

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
            x = tf.matmul(x, self.param(name + "/weights"))
            if layer.bias:
                x = x + self.param(name + "/bias")
            return tf.reshape(x, (tf.shape(x)[0], 1, 1, layer.out))
        if isinstance(layer, Pool):
            return _pool(layer, x)
        if isinstance(layer, ReLU):
            return tf.nn.relu(x)
        if isinstance(layer, Sigmoid):
            return tf.math.sigmoid(x)
        if isinstance(layer, TanH):
            return tf.math.tanh(x)
        if isinstance(layer, Flatten):  # Caffe's order: C, H, W
            return tf.reshape(tf.transpose(x, (0, 3, 1, 2)), (tf.shape(x)[0], 1, 1, -1))
        if isinstance(layer, LRN) and layer.within_channel:
            # Caffe's WITHIN_CHANNEL: x (1 + alpha * mean of x^2 over a local_size square, zero-padded)^-beta
            p = (layer.local_size - 1) // 2
            squares = tf.pad(tf.square(x), [[0, 0], [p, p], [p, p], [0, 0]])
            mean = tf.nn.avg_pool2d(squares, layer.local_size, 1, "VALID")
            return x * tf.pow(1.0 + tf.constant(layer.alpha, tf.float32) * mean, -layer.beta)
        if isinstance(layer, LRN):
            return tf.nn.local_response_normalization(x, depth_radius=(layer.local_size - 1) // 2, bias=layer.k,
                                                      alpha=layer.alpha / layer.local_size, beta=layer.beta)
        if isinstance(layer, BatchNorm):
            return self._batch_norm(layer, name, x, training)
        if isinstance(layer, Scale):
            x = x * self.param(name + "/scale")
            return x + self.param(name + "/bias") if layer.bias else x
        if isinstance(layer, Dropout):
            counter[0] += 1
            if not (training and layer.rate > 0):
                return x
            if dropout_seed is None:
                raise ValueError(f"layer {name!r}: dropout in training needs a dropout_seed")
            seed = tf.random.experimental.stateless_fold_in(dropout_seed, counter[0])
            keep = tf.random.stateless_uniform(tf.shape(x), seed=seed) >= layer.rate
            return tf.where(keep, x * (1.0 / (1.0 - layer.rate)), tf.zeros_like(x))
        if isinstance(layer, Branches):
            outs = [self._forward(branch, x, name + "/", training, dropout_seed, counter) if branch else x
                    for branch in layer.branches]
            if layer.merge == "concat":
                return tf.concat(outs, axis=-1)
            # Caffe's Eltwise takes its bottoms in order (ties of MAX go to the first, as tf.maximum's gradient)
            combine = {"sum": tf.add, "prod": tf.multiply, "max": tf.maximum}[layer.merge]
            y = outs[0]
            for other in outs[1:]:
                y = combine(y, other)
            return y
        raise ValueError(f"layer {name!r}: no forward pass for {type(layer).__name__}")

    def _conv(self, layer: Conv, name: str, x: tf.Tensor) -> tf.Tensor:
        (ph, pw), (sh, sw) = layer.pad_hw, layer.stride_hw
        if ph or pw:
            x = tf.pad(x, [[0, 0], [ph, ph], [pw, pw], [0, 0]])
        kernel = self.param(name + "/weights")
        strides = (1, sh, sw, 1)

        def conv(a: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
            if layer.dilation == 1:
                return tf.nn.conv2d(a, k, strides, "VALID")
            # dilated: every output of stride 1, then every (sh, sw)th, as TF's atrous conv takes no stride
            y = tf.nn.convolution(a, k, strides=1, padding="VALID", dilations=layer.dilation)
            return y[:, ::sh, ::sw, :]

        if layer.groups == 1:
            y = conv(x, kernel)
        else:  # grouped convolution as Caffe's `group`, one conv per channel group
            xs = tf.split(x, layer.groups, axis=-1)
            ks = tf.split(kernel, layer.groups, axis=-1)
            y = tf.concat([conv(a, k) for a, k in zip(xs, ks)], axis=-1)
        return y + self.param(name + "/bias") if layer.bias else y

    def _batch_norm(self, layer: BatchNorm, name: str, x: tf.Tensor, training: bool) -> tf.Tensor:
        """Caffe's BatchNorm: batch statistics unless use_global_stats (default: in the TEST phase only); in
        training the stored sums decay by moving_average_fraction and gain the batch's mean and unbiased
        variance, the factor blob counting the updates; the stored statistics are the sums / factor."""
        mean_blob, var_blob = self.param(name + "/mean"), self.param(name + "/variance")
        factor = self.param(name + "/factor")
        global_stats = (not training) if layer.use_global_stats is None else layer.use_global_stats
        if global_stats:
            stored = factor[0]
            scale = tf.where(stored == 0.0, 0.0, 1.0 / tf.where(stored == 0.0, 1.0, stored))
            mean, var = mean_blob * scale, var_blob * scale
        else:
            mean = tf.reduce_mean(x, axis=(0, 1, 2))
            var = tf.reduce_mean(tf.square(x - mean), axis=(0, 1, 2))
            if training:
                fraction = tf.constant(self.moving_average.get(name, MOVING_AVERAGE_FRACTION), tf.float32)
                m = tf.cast(tf.size(x) // tf.shape(x)[-1], tf.float32)
                correction = tf.where(m > 1.0, m / tf.maximum(m - 1.0, 1.0), 1.0)
                factor.assign(factor * fraction + 1.0)
                mean_blob.assign(tf.stop_gradient(mean) + fraction * mean_blob)
                var_blob.assign(correction * tf.stop_gradient(var) + fraction * var_blob)
        return (x - mean) / tf.sqrt(var + tf.constant(layer.eps, tf.float32))


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


def build_net(spec: NetSpec, seed: int, placement: Sequence[str] | None = None,
              moving_average: Mapping[str, float] | None = None) -> CaffeNet:
    """The TF model of `spec` with weights drawn from Caffe's fillers by a NumPy generator seeded `seed`;
    `placement` names the device of each top-level layer (a net split by layers), None for one device;
    `moving_average` gives a BatchNorm layer's moving_average_fraction by its name (default Caffe's 0.999)."""
    return CaffeNet(spec, seed, placement, moving_average)
