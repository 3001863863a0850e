"""The copy layer where a replica's device changes, and its measured cost (TensorFlow)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from firescale.train.placement import Boundary, LayerPlacement
from firescale.train.timing import median_seconds


def boundary_copy(x: tf.Tensor, source: str, target: str) -> tf.Tensor:
    """Caffe's copy layer: the activations copied to `target` going forward, their gradient back to
    `source` going backward.  Between logical CPU devices (one memory) the copy is made explicitly, so
    that each device holds its own tensors as separate GPUs would; between GPUs TensorFlow's transfer is it."""
    on_cpu = "CPU" in target.upper() and "CPU" in source.upper()

    def copy(t: tf.Tensor, device: str) -> tf.Tensor:
        with tf.device(device):
            return tf.raw_ops.DeepCopy(x=t) if on_cpu else tf.identity(t)

    @tf.custom_gradient
    def forward(t: tf.Tensor) -> Any:
        def backward(dy: tf.Tensor) -> tf.Tensor:
            return copy(dy, source)
        return copy(t, target), backward

    return forward(x)


def _median_round_trip(x: tf.Tensor, move: Any, repeats: int) -> float:
    """Median seconds of a traced forward `move` of x and the backward move of its gradient."""
    @tf.function(autograph=False)
    def round_trip(t: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = move(t)
        return tape.gradient(y, t, output_gradients=y)

    return median_seconds(lambda: round_trip(x).numpy(), repeats)


def measure_copies(placement: LayerPlacement, repeats: int = 31) -> LayerPlacement:
    """Each boundary's forward and backward copy timed on tensors of its size: the median round trip
    through the copy layer less the same round trip through an identity on one device (the call itself)."""
    measured = []
    for b in placement.boundaries:
        with tf.device(b.source):
            x = tf.zeros((b.bytes // 4,), tf.float32)
        copied = _median_round_trip(x, lambda t, b=b: boundary_copy(t, b.source, b.target), repeats)
        alone = _median_round_trip(x, tf.identity, repeats)
        measured.append(Boundary(b.after, b.source, b.target, b.bytes, max(0.0, copied - alone)))
    return LayerPlacement(placement.devices, placement.arch, tuple(measured))
