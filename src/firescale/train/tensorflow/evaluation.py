"""The TensorFlow evaluation step: a test batch's loss sum and top-1, top-5 counts (Caffe's rule)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf


def topk_correct(logits: tf.Tensor, labels: tf.Tensor, k: int) -> tf.Tensor:
    """Images whose true class is among the top k, as Caffe's Accuracy layer counts (ties count against)."""
    true_score = tf.gather(logits, labels, axis=1, batch_dims=1)
    better = tf.reduce_sum(tf.cast(logits >= true_score[:, None], tf.int32), axis=1) - 1
    return tf.reduce_sum(tf.cast(better < k, tf.float64))


def make_eval_step(net: Callable[..., tf.Tensor], num_classes: int,
                   image_shape: tuple[int, ...]) -> Callable[..., Any]:
    """A traced function (images, labels) -> [loss_sum, top1_correct, top5_correct, count] as float64."""
    k5 = min(5, num_classes)
    signature = [tf.TensorSpec((None, *image_shape), tf.float32), tf.TensorSpec((None,), tf.int64)]

    @tf.function(input_signature=signature, autograph=False)
    def step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        logits = net(images, training=False)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        return tf.stack([tf.reduce_sum(tf.cast(losses, tf.float64)), topk_correct(logits, labels, 1),
                         topk_correct(logits, labels, k5), tf.cast(tf.shape(labels)[0], tf.float64)])

    return step
