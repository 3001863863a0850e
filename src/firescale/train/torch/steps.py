"""A batch's summed loss and gradients, and a test batch's sums (loss, top-1, top-5, images), on a PyTorch net."""
from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from firescale.train.torch.nets import CaffeNet


class Blobs:
    """A net's blobs listed once for its steps: all of them in Caffe's order, the learnt ones (what autograd
    differentiates and the ranks sum) and a zero gradient for each of BatchNorm's statistics, which are not
    learnt.  Built once per net, so that no iteration walks the net's blobs again."""

    def __init__(self, net: CaffeNet) -> None:
        self.params = net.params
        keep = net.learnt
        self.learnt = [p for p, k in zip(self.params, keep) if k]
        self.device = self.params[0].device if self.params else torch.device("cpu")
        # Each statistic's index and its zero gradient, as Caffe's cleared diff (the update adds nothing to it).
        self.fixed = {i: torch.zeros_like(p) for i, (p, k) in enumerate(zip(self.params, keep)) if not k}

    def every_blob(self, learnt: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """One gradient per blob from the learnt blobs' (None: the loss did not reach it, a zero gradient)."""
        if not self.fixed:
            return [torch.zeros_like(p) if g is None else g for p, g in zip(self.learnt, learnt)]
        out: list[torch.Tensor] = []
        k = 0
        for i, p in enumerate(self.params):
            if i in self.fixed:
                out.append(self.fixed[i])
                continue
            g = learnt[k]
            out.append(torch.zeros_like(p) if g is None else g)
            k += 1
        return out

    def learnt_of(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The learnt blobs' entries of one-per-blob `grads`."""
        if not self.fixed:
            return list(grads)
        return [g for i, g in enumerate(grads) if i not in self.fixed]


def _inputs(device: torch.device, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch as float32 NCHW images and int64 labels on the net's `device` (no copy when they already are)."""
    return (torch.as_tensor(images, dtype=torch.float32, device=device),
            torch.as_tensor(labels, dtype=torch.int64, device=device))


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[object]:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def loss_and_gradients(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor,
                       dropout_generator: torch.Generator | None = None,
                       autocast_dtype: torch.dtype | None = None,
                       blobs: Blobs | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The summed softmax cross-entropy of a batch (NCHW images) and its gradient for every blob of `net.params`.

    The forward pass is training's (batch statistics, which it folds into BatchNorm's blobs; dropout drawn from
    `dropout_generator`), under autocast to `autocast_dtype` when given; the loss is taken in float32.  A blob
    the loss does not depend on (BatchNorm's statistics, which Caffe keeps among the learnt blobs with
    lr_mult 0) gets a zero gradient, as Caffe's cleared diff.  `blobs`: the net's, listed once by the caller
    that steps it every iteration (default: listed now).
    """
    blobs = blobs or Blobs(net)
    images, labels = _inputs(blobs.device, images, labels)
    with _autocast(images.device, autocast_dtype):
        logits = net(images, training=True, dropout_generator=dropout_generator)
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
    grads = torch.autograd.grad(loss_sum, blobs.learnt, allow_unused=True)
    return loss_sum.detach(), blobs.every_blob(grads)


def loss_backward(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor,
                  dropout_generator: torch.Generator | None = None,
                  autocast_dtype: torch.dtype | None = None, blobs: Blobs | None = None) -> torch.Tensor:
    """The summed loss of a batch, its gradients left in each learnt blob's `.grad` by `backward()`: the gradient
    hooks an overlapped allreduce hangs on the blobs run as backward produces each (wait-free backprop)."""
    blobs = blobs or Blobs(net)
    images, labels = _inputs(blobs.device, images, labels)
    for p in blobs.learnt:
        p.grad = None
    with _autocast(images.device, autocast_dtype):
        logits = net(images, training=True, dropout_generator=dropout_generator)
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
    loss_sum.backward()
    return loss_sum.detach()


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Images whose true class is among the top k, as Caffe's Accuracy layer counts (ties count against)."""
    true_score = logits.gather(1, labels[:, None])
    better = (logits >= true_score).sum(dim=1) - 1
    return (better < k).sum().to(torch.float64)


def eval_sums(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor,
              autocast_dtype: torch.dtype | None = None) -> np.ndarray:
    """[loss_sum, top1_correct, top5_correct, count] of a test batch as float64, in the TEST phase's forward
    (stored BatchNorm statistics, no dropout); top-5 is top-min(5, classes), as Caffe's Accuracy takes it."""
    images, labels = _inputs(net.params[0].device if net.infos else torch.device("cpu"), images, labels)
    k5 = min(5, net.spec.num_classes)
    with torch.no_grad():
        with _autocast(images.device, autocast_dtype):
            logits = net(images, training=False)
        logits = logits.float()
        losses = F.cross_entropy(logits, labels, reduction="none")
        sums = torch.stack([losses.to(torch.float64).sum(), topk_correct(logits, labels, 1),
                            topk_correct(logits, labels, k5),
                            torch.tensor(float(labels.shape[0]), dtype=torch.float64, device=logits.device)])
    return sums.cpu().numpy()
