"""Each layer's forward and backward times inside real training iterations of a CaffeNet, as Paleo profiles
layers: a mark before and after every layer as the forward pass runs it, and one where its output's and its
input's gradients pass in the backward pass (CUDA events on a GPU, the host clock on a CPU).  Layers timed alone
at their own input shape add up to other than the iteration: timed inside the iteration, they add up to it,
less what runs between them.  The times come as the DAG paper's trace (model/traces.py), every backend's one
record of a layer's times."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from firescale.model.traces import DATA_WAIT_LAYER, LayerTrace
from firescale.nets.spec import Softmax
from firescale.train.timing import median_seconds
from firescale.train.torch.distributed import Rank
from firescale.train.torch.nets import CaffeNet
from firescale.train.torch.steps import _autocast

LOSS = "loss"   # the softmax cross-entropy, which CaffeNet.forward leaves to its caller


class _Clock:
    """Marks on the device's timeline: CUDA events on a GPU (read after one synchronisation), else the host's."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


class _GradientMark(torch.autograd.Function):
    """The identity; its backward calls `note` as the gradient passes (before the layers beneath it run theirs)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, note: Callable[[], None]) -> torch.Tensor:
        ctx.note = note
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.note()
        return grad, None


@dataclass
class _Marks:
    forward: list[Any] = field(default_factory=list)    # before, after
    backward: list[Any] = field(default_factory=list)   # its output's gradient arrived, its input's left
    inner: list[str] = field(default_factory=list)      # layers run inside it (a block's branches)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


class IterationProbe:
    """Marks every layer of `net` while installed: `run(images, labels)` is one timed training iteration."""

    def __init__(self, net: CaffeNet, autocast: torch.dtype | None = None) -> None:
        self.net, self.autocast = net, autocast
        self.clock = _Clock(net.params[0].device if net.params else torch.device("cpu"))
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self.order: list[str] = []

    def run(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """One iteration (forward, loss, backward) with every layer marked; its gradients, one per blob."""
        marks: dict[str, _Marks] = {}
        stack: list[str] = []
        original = self.net._layer
        clock = self.clock

        def layer(spec_layer: Any, name: str, x: torch.Tensor, training: bool, generator: Any) -> torch.Tensor:
            own = marks.setdefault(name, _Marks())
            if stack:
                marks[stack[-1]].inner.append(name)
            if x.requires_grad:
                x = _GradientMark.apply(x, lambda: own.backward.append(clock.mark()))
            stack.append(name)
            own.forward.append(clock.mark())
            y = original(spec_layer, name, x, training, generator)
            own.forward.append(clock.mark())
            stack.pop()
            if y.requires_grad:
                y = _GradientMark.apply(y, lambda: own.backward.insert(0, clock.mark()))
            return y

        self.net._layer = layer  # type: ignore[method-assign,assignment]
        try:
            learnt = [p for p, keep in zip(self.net.params, self.net.learnt) if keep]
            with _autocast(images.device, self.autocast):
                logits = self.net(images, training=True)
            loss_start = clock.mark()
            loss = F.cross_entropy(logits.float(), labels, reduction="sum")
            loss_end = clock.mark()
            grads = torch.autograd.grad(loss, learnt, allow_unused=True)
            backward_end = clock.mark()
        finally:
            del self.net._layer
        clock.sync()
        self._collect(marks, loss_start, loss_end, backward_end)
        found = iter(grads)   # as loss_and_gradients gives them: a zero gradient for each blob not learnt
        out = []
        for p, keep in zip(self.net.params, self.net.learnt):
            g = next(found) if keep else None
            out.append(torch.zeros_like(p) if g is None else g)
        return out

    def _collect(self, marks: dict[str, _Marks], loss_start: Any, loss_end: Any, backward_end: Any) -> None:
        clock, seconds = self.clock, {}
        for name, m in marks.items():
            fwd = clock.seconds(m.forward[0], m.forward[1])
            # a layer reading the data computes no gradient of its input: its backward ends with the iteration's
            bwd_end = m.backward[1] if len(m.backward) > 1 else backward_end
            bwd = clock.seconds(m.backward[0], bwd_end) if m.backward else 0.0
            seconds[name] = (fwd, bwd)
        for name, m in marks.items():   # a block's own time: its merge, without the layers of its branches
            if m.inner:
                fwd, bwd = seconds[name]
                seconds[name] = (max(fwd - sum(seconds[i][0] for i in m.inner), 0.0),
                                 max(bwd - sum(seconds[i][1] for i in m.inner), 0.0))
        last = next((m for m in reversed(marks.values()) if m.backward), None)
        seconds[LOSS] = (clock.seconds(loss_start, loss_end),
                         clock.seconds(loss_end, last.backward[0]) if last else 0.0)
        if not self.order:
            self.order = list(marks) + [LOSS]
        for name, pair in seconds.items():
            self.samples.setdefault(name, []).append(pair)

    def medians(self) -> list[tuple[str, float, float]]:
        """Each layer record's (name, forward, backward) median seconds, in the order the forward pass ran them."""
        return [(name, _median([s[0] for s in self.samples[name]]), _median([s[1] for s in self.samples[name]]))
                for name in self.order]

    def reset(self) -> None:
        self.samples.clear()


def loss_layer(net: CaffeNet) -> str:
    """The name of the net's softmax layer, whose row holds the loss's times (LOSS without one)."""
    return next((layer.name for layer in net.spec.layers if isinstance(layer, Softmax)), LOSS)


def profile_iterations(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor, *, autocast: torch.dtype | None,
                       warm_up: int, iterations: int,
                       update: Callable[[list[torch.Tensor], int], None] | None = None) -> list[LayerTrace]:
    """Each layer's median times over `iterations` marked iterations of one batch (after `warm_up` unmeasured ones),
    `update` applied to the gradients after each as in training: one trace row a layer record (a block's own merge
    apart from its branches' layers), the loss under the net's softmax layer's name, no communication."""
    if iterations < 1 or warm_up < 0:
        raise ValueError(f"iterations must be at least 1 and warm_up at least 0, not {iterations} and {warm_up}")
    probe = IterationProbe(net, autocast)
    for i in range(warm_up + iterations):
        if i == warm_up:
            probe.reset()
        grads = probe.run(images, labels)
        if update is not None:
            update(grads, i)
    loss = loss_layer(net)
    gradient_bytes: dict[str, int] = {}   # what a layer's learnt blobs send in the gradient allreduce
    for info, p, keep in zip(net.infos, net.params, net.learnt):
        if keep:
            gradient_bytes[info.layer] = gradient_bytes.get(info.layer, 0) + p.numel() * p.element_size()
    return [LayerTrace(k, loss if name == LOSS else name, 1e6 * fwd, 1e6 * bwd, 0.0,
                       gradient_bytes.get(name, 0)) for k, (name, fwd, bwd) in enumerate(probe.medians(), start=1)]


def _summed(rank: Rank, tensors: list[torch.Tensor]) -> None:
    """A sum of `tensors` over the ranks, waited for on the host (a GPU's stream included)."""
    rank.sum(tensors)[-1].cpu()


def profile_net(net: CaffeNet, images: torch.Tensor, labels: torch.Tensor, rank: Rank, *, data_wait_s: float,
                autocast: torch.dtype | None, repeats: int = 5) -> list[LayerTrace]:
    """The trainer's layer trace (`train --profile-layers`): layer 0 is `data_wait`, the mean data wait the
    trainer measured (I/O its prefetching left exposed, which a replay adds in series), then every layer's median
    forward and backward times inside `repeats` real iterations of the batch, with no update, and the median
    time of a sum over the ranks of its learnt blobs' gradients (0 on one rank).  Every rank calls this together."""
    trace = [LayerTrace(0, DATA_WAIT_LAYER, data_wait_s * 1e6, 0.0, 0.0, 0)]
    layers = profile_iterations(net, images, labels, autocast=autocast, warm_up=1, iterations=repeats)
    learnt: dict[str, list[torch.Tensor]] = {}
    for info, p, keep in zip(net.infos, net.params, net.learnt):
        if keep:
            learnt.setdefault(info.layer, []).append(p)
    for row in layers:
        comm_us = 0.0
        if rank.size > 1 and row.name in learnt:
            zeros = [torch.zeros_like(p) for p in learnt[row.name]]
            comm_us = 1e6 * median_seconds(partial(_summed, rank, zeros), repeats, rank.barrier)
        trace.append(LayerTrace(row.layer_id, row.name, row.forward_us, row.backward_us, comm_us,
                                row.gradient_bytes))
    return trace
