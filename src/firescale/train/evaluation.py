"""Evaluation on the test set (its first N images), sharded over ranks and summed: top-1, top-5 (Caffe's rule), loss.

Each backend traces its own step (batch -> loss sum, top-1 and top-5 counts, images); this loop is theirs in common."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


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


def rank_share(images: int, rank: int, size: int) -> int:
    """How many of the first `images` test records rank `rank` of `size` reads: records rank, rank+size, ..."""
    return len(range(rank, images, size))


def evaluate(step: Callable[..., Any], batches: Iterable[tuple[Any, Any]],
             sum_over_ranks: Callable[[list[float]], np.ndarray], max_images: int | None = None) -> EvalSums:
    """Run `step` over this rank's test batches (their first `max_images` images, when given), then sum the totals
    over all ranks.  `step` returns the four sums of a batch as anything NumPy reads (a host copy)."""
    totals = np.zeros(4, np.float64)
    left = max_images
    for images, labels in batches:
        if left is not None and left <= 0:
            break
        if left is not None and left < int(labels.shape[0]):
            images, labels = images[:left], labels[:left]
        totals += np.asarray(step(images, labels), np.float64)
        if left is not None:
            left -= int(labels.shape[0])
    loss_sum, top1, top5, count = sum_over_ranks(totals.tolist())
    return EvalSums(float(loss_sum), float(top1), float(top5), float(count))
