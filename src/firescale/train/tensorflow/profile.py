"""Layer-wise timing of a CaffeNet on the running ranks, as the DAG paper's trace (Table VI)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from firescale.model.traces import DATA_WAIT_LAYER, LayerTrace
from firescale.nets.spec import Softmax
from firescale.train.tensorflow.distributed import Rank
from firescale.train.tensorflow.nets import CaffeNet
from firescale.train.timing import median_seconds


def _median_us(fn: Callable[[], Any], repeats: int, barrier: Callable[[], None] | None = None) -> float:
    return median_seconds(fn, repeats, barrier) * 1e6


def _read_back(fn: Callable[..., Any], *args: Any) -> Callable[[], None]:
    """A call of `fn(*args)` that waits for its result, a tensor or a list of them, by reading it to the host."""
    def call() -> None:
        out = fn(*args)
        for t in out if isinstance(out, (list, tuple)) else [out]:
            t.numpy()
    return call


def profile_net(net: CaffeNet, images: tf.Tensor, labels: tf.Tensor, rank: Rank, *, data_wait_s: float,
                repeats: int = 5) -> list[LayerTrace]:
    """Forward, backward and gradient-allreduce microseconds of each top-level layer on one batch.

    Layer 0 is `data_wait` with the measured mean data wait as its forward time: the I/O the trainer's
    prefetching left exposed, not the time to read a batch, so a replay adds it in series rather than
    hiding it behind computation a second time (model/traces.py).
    A layer's backward time computes the gradients of its input and its own weights from an upstream
    gradient of ones (the loss layer from the softmax cross-entropy); its comm time is a Horovod sum of
    its weight gradients over all ranks (0 on one rank).  Every rank must call this together.
    """
    trace = [LayerTrace(0, DATA_WAIT_LAYER, data_wait_s * 1e6, 0.0, 0.0, 0)]
    x = images
    seed = tf.constant([0, 0], tf.int64)
    for index, layer in enumerate(net.spec.layers, start=1):
        params = [p for p, info in zip(net.params, net.infos)
                  if info.layer == layer.name or info.layer.startswith(layer.name + "/")]
        is_loss = isinstance(layer, Softmax)

        def forward(t: tf.Tensor, layer: Any = layer, is_loss: bool = is_loss) -> tf.Tensor:
            if is_loss:
                logits = tf.reshape(t, (tf.shape(t)[0], -1))
                return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
            return net._forward((layer,), t, "", True, seed, [0])

        def backward(t: tf.Tensor, forward: Any = forward, params: list = params) -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                tape.watch(t)
                y = forward(t)
            grads = tape.gradient(y, [t, *params], output_gradients=tf.ones_like(y))
            return [g for g in grads if g is not None]

        fwd, bwd = tf.function(forward, autograph=False), tf.function(backward, autograph=False)
        inp = x
        forward_us = _median_us(_read_back(fwd, inp), repeats)
        backward_us = _median_us(_read_back(bwd, inp), repeats)
        grads = [tf.zeros_like(p) for p in params]
        comm_us = 0.0
        if params and rank.size > 1:
            comm_us = _median_us(_read_back(rank.sum, grads), repeats, rank.barrier)
        grad_bytes = sum(int(p.shape.num_elements()) * 4 for p in params)
        trace.append(LayerTrace(index, layer.name, forward_us, backward_us, comm_us, grad_bytes))
        if not is_loss:
            x = fwd(inp)
    return trace
