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


Rates = float | list[float]   # rate * lr_mult in float32: one for every blob, or one a blob


def _times(rates: Rates, factor: np.float32) -> Rates:
    """Each float32 rate times a float32 factor, rounded to float32 (one number stays one number)."""
    if isinstance(rates, float):
        return _f32(np.float32(rates) * factor)
    return (np.asarray(rates, np.float32) * factor).tolist()


class _Constants:
    """What the update needs of the solver's settings and the blobs' multipliers, in float32 as the update
    takes them, worked out once rather than at every iteration."""

    def __init__(self, c: SolverConfig, lr_mults: list[float], decay_mults: list[float]) -> None:
        self.momentum, self.momentum2 = _f32(c.momentum), _f32(c.momentum2)
        self.one_plus_momentum, self.one_minus_momentum = _f32(1.0 + c.momentum), _f32(1.0 - c.momentum)
        self.one_minus_momentum2 = _f32(1.0 - c.momentum2)
        self.rms_decay, self.one_minus_rms_decay = _f32(c.rms_decay), _f32(1.0 - c.rms_decay)
        self.delta = _f32(c.delta)
        # lr_mult per blob; one number where every blob has the same (a float32 scalar acts as each of a list)
        self.lr_mults = np.asarray(lr_mults, np.float32)
        self.lr_mult: np.float32 | None = self.lr_mults[0] if len(set(lr_mults)) == 1 else None
        # the blobs that decay, and weight_decay * decay_mult for each of them
        self.decayed = [i for i, m in enumerate(decay_mults) if c.weight_decay * m != 0]
        self.all_decayed = len(self.decayed) == len(decay_mults)
        decays = [_f32(c.weight_decay * decay_mults[i]) for i in self.decayed]
        self.decays: Rates = decays[0] if decays and len(set(decays)) == 1 else decays

    def rates(self, rate: float) -> Rates:
        """rate * lr_mult for every blob, each rounded to float32 as TensorFlow's backend takes it."""
        if self.lr_mult is not None:
            return _f32(np.float32(rate) * self.lr_mult)
        return (np.float32(rate) * self.lr_mults).tolist()


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
        self.params = net.params    # the blobs, listed once (the net keeps the same tensors)
        self.names = [info.name for info in net.infos]
        n = len(self.names)
        self.lr_mults = [float(m) for m in (lr_mults if lr_mults is not None else [1.0] * n)]
        self.decay_mults = [float(m) for m in (decay_mults if decay_mults is not None else [1.0] * n)]
        if len(self.lr_mults) != n or len(self.decay_mults) != n:
            raise ValueError(f"net {net.spec.name!r} has {n} blobs, but {len(self.lr_mults)} lr_mults and "
                             f"{len(self.decay_mults)} decay_mults were given")
        self.history: Tensors = [torch.zeros_like(p).detach() for p in self.params]
        self.update_history: Tensors = ([torch.zeros_like(p).detach() for p in self.params]
                                        if HISTORY_BLOBS[config.type] == 2 else [])
        self._constants = _Constants(config, self.lr_mults, self.decay_mults)

    # ------------------------------------------------------------ the update
    @torch.no_grad()
    def apply(self, grads: Sequence[torch.Tensor], rate: float, iteration: int) -> None:
        """One update of every blob with learning rate `rate` at 0-based `iteration`; `grads` are not changed."""
        c, params = self.config, self.params
        if len(grads) != len(params):
            raise ValueError(f"net {self.net.spec.name!r} has {len(params)} blobs, but {len(grads)} gradients "
                             f"were given")
        grads = list(grads)
        if c.clip_gradients >= 0:
            grads = clip_gradients(grads, c.clip_gradients, c.iter_size)
        grads = self._regularize(params, grads)
        torch._foreach_sub_(params, self._update_values(grads, self._constants.rates(rate), iteration))

    def _regularize(self, params: Tensors, grads: Tensors) -> Tensors:
        """Each gradient plus its blob's decay term (a new tensor; a blob without decay keeps its gradient)."""
        k = self._constants
        if not k.decayed:
            return grads
        terms: Tensors | tuple[torch.Tensor, ...] = params if k.all_decayed else [params[i] for i in k.decayed]
        if self.config.regularization_type != "L2":
            terms = torch._foreach_sign(terms)
        terms = torch._foreach_mul(terms, k.decays)
        if k.all_decayed:
            return list(torch._foreach_add(grads, terms))
        out = list(grads)
        for i, g in zip(k.decayed, torch._foreach_add([grads[i] for i in k.decayed], terms)):
            out[i] = g
        return out

    def _update_values(self, g: Tensors, rates: Rates, iteration: int) -> Tensors:
        """The values to subtract from the blobs; the history blobs are updated in place."""
        c, h, k = self.config, self.history, self._constants
        if c.type in ("SGD", "Nesterov"):
            previous = [x.clone() for x in h] if c.type == "Nesterov" else []
            torch._foreach_mul_(h, k.momentum)                          # h = rate * g + momentum * h
            torch._foreach_add_(h, torch._foreach_mul(g, rates))
            if c.type == "SGD":
                return h
            update = torch._foreach_mul(h, k.one_plus_momentum)         # (1 + momentum) h - momentum h_previous
            torch._foreach_sub_(update, torch._foreach_mul(previous, k.momentum))
            return list(update)
        if c.type in ("AdaGrad", "RMSProp"):
            squares = torch._foreach_mul(g, g)
            if c.type == "RMSProp":                                     # h = (1 - d) g^2 + d h
                torch._foreach_mul_(squares, k.one_minus_rms_decay)
                torch._foreach_mul_(h, k.rms_decay)
            torch._foreach_add_(h, squares)                             # AdaGrad: h = h + g^2
            update = torch._foreach_div(g, torch._foreach_add(torch._foreach_sqrt(h), k.delta))
            torch._foreach_mul_(update, rates)                          # rate * g / (sqrt(h) + delta)
            return list(update)
        if c.type == "AdaDelta":
            return self._adadelta(g, rates)
        return self._adam(g, rates, iteration)

    def _adadelta(self, g: Tensors, rates: Rates) -> Tensors:
        k, h, u = self._constants, self.history, self.update_history
        keep, new, delta = k.momentum, k.one_minus_momentum, k.delta
        _decay_into(h, torch._foreach_mul(g, g), keep, new)             # h = (1 - m) g^2 + m h
        ratio = torch._foreach_div(torch._foreach_add(u, delta), torch._foreach_add(h, delta))
        step = torch._foreach_mul(g, torch._foreach_sqrt(ratio))       # g sqrt((u + delta) / (h + delta))
        _decay_into(u, torch._foreach_mul(step, step), keep, new)       # u = (1 - m) step^2 + m u
        return list(torch._foreach_mul(step, rates))

    def _adam(self, g: Tensors, rates: Rates, iteration: int) -> Tensors:
        c, k, m, v = self.config, self._constants, self.history, self.update_history
        b1, b2, t = c.momentum, c.momentum2, float(iteration + 1)
        correction = np.float32(math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t))   # in float64, as TensorFlow's
        _decay_into(m, g, k.momentum, k.one_minus_momentum)             # m = (1 - b1) g + b1 m
        _decay_into(v, torch._foreach_mul(g, g), k.momentum2, k.one_minus_momentum2)  # v = (1 - b2) g^2 + b2 v
        update = torch._foreach_div(m, torch._foreach_add(torch._foreach_sqrt(v), k.delta))
        torch._foreach_mul_(update, _times(rates, correction))
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
