"""A batch's summed loss and gradients, and a test batch's sums (loss, top-1, top-5, images), on a PyTorch net."""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from firescale.train.torch.nets import CaffeNet


def _inputs(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch as float32 NCHW images and int64 labels on the net's device (no copy when they already are)."""
    device = net.params[0].device if net.infos else torch.device("cpu")
    return (torch.as_tensor(images, dtype=torch.float32, device=device),
            torch.as_tensor(labels, dtype=torch.int64, device=device))


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[object]:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def loss_and_gradients(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor,
                       dropout_generator: torch.Generator | None = None,
                       autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The summed softmax cross-entropy of a batch (NCHW images) and its gradient for every blob of `net.params`.

    The forward pass is training's (batch statistics, which it folds into BatchNorm's blobs; dropout drawn from
    `dropout_generator`), under autocast to `autocast_dtype` when given; the loss is taken in float32.  A blob
    the loss does not depend on (BatchNorm's statistics, which Caffe keeps among the learnable blobs with
    lr_mult 0) gets a zero gradient, as Caffe's cleared diff.
    """
    images, labels = _inputs(net, images, labels)
    with _autocast(images.device, autocast_dtype):
        logits = net(images, training=True, dropout_generator=dropout_generator)
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
    learnt = [p for p, keep in zip(net.params, net.learnt) if keep]
    found = iter(torch.autograd.grad(loss_sum, learnt, allow_unused=True))
    grads = []
    for p, keep in zip(net.params, net.learnt):
        g = next(found) if keep else None
        grads.append(torch.zeros_like(p) if g is None else g)
    return loss_sum.detach(), grads


def loss_backward(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor,
                  dropout_generator: torch.Generator | None = None,
                  autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The summed loss of a batch, its gradients left in each learnt blob's `.grad` by `backward()`: the gradient
    hooks an overlapped allreduce hangs on the blobs run as backward produces each (wait-free backprop)."""
    images, labels = _inputs(net, images, labels)
    for p, keep in zip(net.params, net.learnt):
        if keep:
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
    images, labels = _inputs(net, images, labels)
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
