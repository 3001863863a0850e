"""Evaluation on the test set (its first N images), sharded over ranks and summed: top-1, top-5 (Caffe's rule), loss."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf


@dataclass
class EvalSums:
    """Totals over the test set (all ranks): loss summed over images, correct counts, image count."""

    loss_sum: float
    top1_correct: float
    top5_correct: float
    count: float

    @property
    def top1(self) -> float:
        return self.top1_correct / self.count

    @property
    def top5(self) -> float:
        return self.top5_correct / self.count

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count


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


def rank_share(images: int, rank: int, size: int) -> int:
    """How many of the first `images` test records rank `rank` of `size` reads: records rank, rank+size, ..."""
    return len(range(rank, images, size))


def evaluate(step: Callable[..., tf.Tensor], batches: Iterable[tuple[tf.Tensor, tf.Tensor]],
             sum_over_ranks: Callable[[list[float]], np.ndarray], max_images: int | None = None) -> EvalSums:
    """Run `step` over this rank's test batches (their first `max_images` images, when given), then sum the totals
    over all ranks."""
    totals = np.zeros(4, np.float64)
    left = max_images
    for images, labels in batches:
        if left is not None and left <= 0:
            break
        if left is not None and left < int(labels.shape[0]):
            images, labels = images[:left], labels[:left]
        totals += step(images, labels).numpy()
        if left is not None:
            left -= int(labels.shape[0])
    loss_sum, top1, top5, count = sum_over_ranks(totals.tolist())
    return EvalSums(float(loss_sum), float(top1), float(top5), float(count))
