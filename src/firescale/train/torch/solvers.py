"""Caffe's six update rules (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) on a PyTorch net's blobs, in place."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from firescale.caffe.solver import HISTORY_BLOBS, SolverConfig
from firescale.train.torch.nets import CaffeNet, from_trainer_layout, to_trainer_layout

Tensors = list[torch.Tensor]


def clip_gradients(grads: Sequence[torch.Tensor], threshold: float, iter_size: int = 1) -> Tensors:
    """Caffe's ClipGradients, before Normalize: when the joint L2 norm of the accumulated gradients
    (`iter_size` x the normalised `grads`) exceeds `threshold`, scale them all by threshold / norm (new tensors)."""
    l2norm = float(iter_size) * torch.sqrt(torch.stack([g.square().sum() for g in grads]).sum())
    scale = torch.where(l2norm > threshold, threshold / torch.clamp_min(l2norm, 1e-30), 1.0)
    return list(torch._foreach_mul(list(grads), scale))


def _f32(x: float | np.floating) -> float:
    """`x` rounded to float32, as TensorFlow's tf.constant(x, tf.float32) holds it (a Python float given to a
    float32 tensor's op acts as its float32, so this matters only where two scalars meet first)."""
    return float(np.float32(x))


class CaffeSolver:
    """Applies Caffe's regularisation and update rule to every blob of a net, keeping Caffe's history blobs.

    The gradients handed to `apply` are already normalised (the mean over the global batch and `iter_size`),
    as after Caffe's `Normalize`.  In Caffe's SGDSolver::ApplyUpdate order: clip first, on the gradients as
    they are before Normalize (`iter_size` times ours), all blobs together by their joint L2 norm; then per
    blob add weight decay (L2: `decay * w`, L1: `decay * sign(w)`, with `decay = weight_decay * decay_mult`),
    compute the update with `local_rate = rate * lr_mult` and subtract it from the blob.  The arithmetic is
    TensorFlow's backend's, in float32 and in its order, so that both give the same numbers.

    `history` and `update_history` (AdaDelta's updates, Adam's second moment) are in torch's layout, like the
    blobs; `state_arrays` gives them in the trainer's, under the TensorFlow solver's keys.
    """

    def __init__(self, config: SolverConfig, net: CaffeNet, lr_mults: Sequence[float] | None = None,
                 decay_mults: Sequence[float] | None = None) -> None:
        if config.type not in HISTORY_BLOBS:
            raise ValueError(f"unknown solver type {config.type!r}; expected one of {', '.join(HISTORY_BLOBS)}")
        self.config = config
        self.net = net
        self.names = [info.name for info in net.infos]
        n = len(self.names)
        self.lr_mults = [float(m) for m in (lr_mults if lr_mults is not None else [1.0] * n)]
        self.decay_mults = [float(m) for m in (decay_mults if decay_mults is not None else [1.0] * n)]
        if len(self.lr_mults) != n or len(self.decay_mults) != n:
            raise ValueError(f"net {net.spec.name!r} has {n} blobs, but {len(self.lr_mults)} lr_mults and "
                             f"{len(self.decay_mults)} decay_mults were given")
        self.history: Tensors = [torch.zeros_like(p).detach() for p in net.params]
        self.update_history: Tensors = ([torch.zeros_like(p).detach() for p in net.params]
                                        if HISTORY_BLOBS[config.type] == 2 else [])

    # ------------------------------------------------------------ the update
    @torch.no_grad()
    def apply(self, grads: Sequence[torch.Tensor], rate: float, iteration: int) -> None:
        """One update of every blob with learning rate `rate` at 0-based `iteration`; `grads` are not changed."""
        c = self.config
        params = self.net.params
        grads = [g.detach() for g in grads]
        if len(grads) != len(params):
            raise ValueError(f"net {self.net.spec.name!r} has {len(params)} blobs, but {len(grads)} gradients "
                             f"were given")
        if c.clip_gradients >= 0:
            grads = clip_gradients(grads, c.clip_gradients, c.iter_size)
        grads = self._regularize(params, grads)
        rates = [_f32(np.float32(rate) * np.float32(m)) for m in self.lr_mults]
        torch._foreach_sub_(params, self._update_values(grads, rates, iteration))

    def _regularize(self, params: Tensors, grads: Tensors) -> Tensors:
        """Each gradient plus its blob's decay term (a new tensor; a blob without decay keeps its gradient)."""
        decayed = [i for i, m in enumerate(self.decay_mults) if self.config.weight_decay * m != 0]
        if not decayed:
            return grads
        terms: Tensors | tuple[torch.Tensor, ...] = [params[i] for i in decayed]
        if self.config.regularization_type != "L2":
            terms = torch._foreach_sign(terms)
        terms = torch._foreach_mul(terms, [_f32(self.config.weight_decay * self.decay_mults[i]) for i in decayed])
        out = list(grads)
        for i, g in zip(decayed, torch._foreach_add([grads[i] for i in decayed], terms)):
            out[i] = g
        return out

    def _update_values(self, g: Tensors, rates: list[float], iteration: int) -> Tensors:
        """The values to subtract from the blobs; the history blobs are updated in place."""
        c, h = self.config, self.history
        if c.type in ("SGD", "Nesterov"):
            previous = [x.clone() for x in h] if c.type == "Nesterov" else []
            torch._foreach_mul_(h, _f32(c.momentum))                    # h = rate * g + momentum * h
            torch._foreach_add_(h, torch._foreach_mul(g, rates))
            if c.type == "SGD":
                return h
            update = torch._foreach_mul(h, _f32(1.0 + c.momentum))      # (1 + momentum) h - momentum h_previous
            torch._foreach_sub_(update, torch._foreach_mul(previous, _f32(c.momentum)))
            return list(update)
        if c.type in ("AdaGrad", "RMSProp"):
            squares = torch._foreach_mul(g, g)
            if c.type == "RMSProp":                                     # h = (1 - d) g^2 + d h
                torch._foreach_mul_(squares, _f32(1.0 - c.rms_decay))
                torch._foreach_mul_(h, _f32(c.rms_decay))
            torch._foreach_add_(h, squares)                             # AdaGrad: h = h + g^2
            update = torch._foreach_div(g, torch._foreach_add(torch._foreach_sqrt(h), _f32(c.delta)))
            torch._foreach_mul_(update, rates)                          # rate * g / (sqrt(h) + delta)
            return list(update)
        if c.type == "AdaDelta":
            return self._adadelta(g, rates)
        return self._adam(g, rates, iteration)

    def _adadelta(self, g: Tensors, rates: list[float]) -> Tensors:
        c, h, u = self.config, self.history, self.update_history
        keep, new, delta = _f32(c.momentum), _f32(1.0 - c.momentum), _f32(c.delta)
        _decay_into(h, torch._foreach_mul(g, g), keep, new)             # h = (1 - m) g^2 + m h
        ratio = torch._foreach_div(torch._foreach_add(u, delta), torch._foreach_add(h, delta))
        step = torch._foreach_mul(g, torch._foreach_sqrt(ratio))       # g sqrt((u + delta) / (h + delta))
        _decay_into(u, torch._foreach_mul(step, step), keep, new)       # u = (1 - m) step^2 + m u
        return list(torch._foreach_mul(step, rates))

    def _adam(self, g: Tensors, rates: list[float], iteration: int) -> Tensors:
        c, m, v = self.config, self.history, self.update_history
        b1, b2, t = c.momentum, c.momentum2, float(iteration + 1)
        correction = np.float32(math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t))   # in float64, as TensorFlow's
        _decay_into(m, g, _f32(b1), _f32(1.0 - b1))                 # m = (1 - b1) g + b1 m
        _decay_into(v, torch._foreach_mul(g, g), _f32(b2), _f32(1.0 - b2))  # v = (1 - b2) g^2 + b2 v
        update = torch._foreach_div(m, torch._foreach_add(torch._foreach_sqrt(v), _f32(c.delta)))
        torch._foreach_mul_(update, [_f32(np.float32(r) * correction) for r in rates])
        return list(update)

    # ------------------------------------------------------------ state for snapshots
    def _history_blobs(self) -> list[tuple[str, str, torch.Tensor]]:
        """(key, the blob's name, history blob) for every history blob, in the TensorFlow solver's order."""
        pairs = [(f"history/{n}", n, h) for n, h in zip(self.names, self.history)]
        return pairs + [(f"update_history/{n}", n, u) for n, u in zip(self.names, self.update_history)]

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Caffe's history blobs as NumPy arrays in the trainer's layout, keyed `history/<param>` and
        `update_history/<param>` (the TensorFlow solver's keys and layouts: snapshots are backend-neutral)."""
        return {key: to_trainer_layout(self.net, name, blob.cpu().numpy()) for key, name, blob in self._history_blobs()}

    @torch.no_grad()
    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore the history blobs written by `state_arrays` (either backend's); a missing key is a KeyError, an
        array of another shape a FirescaleError naming the blob."""
        for key, name, blob in self._history_blobs():
            if key not in arrays:
                raise KeyError(key)
            blob.copy_(torch.from_numpy(from_trainer_layout(self.net, name, arrays[key])))

def _decay_into(history: Tensors, values: Tensors | tuple[torch.Tensor, ...], keep: float, new: float) -> None:
    """history = new * values + keep * history, in place (`values` are left as they are)."""
    scaled = torch._foreach_mul(values, new)
    torch._foreach_mul_(history, keep)
    torch._foreach_add_(history, scaled)
