"""Each layer's forward and backward seconds inside real training iterations of a CaffeNet, as Paleo profiles
layers: a mark before and after every layer as the forward pass runs it, and one where its output's and its
input's gradients pass in the backward pass (CUDA events on a GPU, the host clock on a CPU).  Layers timed alone
at their own input shape add up to other than the iteration (up to 1.5 times it in bf16 on an H200): timed
inside the iteration, they add up to it, less what runs between them."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

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
    def forward(ctx: Any, x: torch.Tensor, note: Callable[[], None]) -> torch.Tensor:  # type: ignore[override]
        ctx.note = note
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.note()
        return grad, None


@dataclass
class _Marks:
    forward: list[Any] = field(default_factory=list)    # before, after
    backward: list[Any] = field(default_factory=list)   # its output's gradient arrived, its input's left
    inner: list[str] = field(default_factory=list)      # layers run inside it (a block's branches)


@dataclass(frozen=True)
class LayerSeconds:
    """The median seconds of one layer record (a block's own merge, without its branches) per pass."""

    name: str
    forward_s: float
    backward_s: float


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

        self.net._layer = layer  # type: ignore[method-assign]
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

    def medians(self) -> list[LayerSeconds]:
        return [LayerSeconds(name, _median([s[0] for s in self.samples[name]]),
                             _median([s[1] for s in self.samples[name]])) for name in self.order]

    def reset(self) -> None:
        self.samples.clear()


def profile_iterations(net: CaffeNet, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                       autocast: torch.dtype | None, warm_up: int, iterations: int,
                       update: Callable[[list[torch.Tensor], int], None]) -> tuple[list[LayerSeconds], float]:
    """Each layer's median seconds per pass over `iterations` marked iterations (after `warm_up` unmeasured
    ones), the solver's `update` applied after each as in training; and the update's median seconds."""
    probe, clock = IterationProbe(net, autocast), None
    updates = []
    for i in range(warm_up + iterations):
        if i == warm_up:
            probe.reset()
        grads = probe.run(*batches[i % len(batches)])
        clock = probe.clock
        start = clock.mark()
        update(grads, i)
        end = clock.mark()
        clock.sync()
        if i >= warm_up:
            updates.append(clock.seconds(start, end))
    return probe.medians(), _median(updates)
