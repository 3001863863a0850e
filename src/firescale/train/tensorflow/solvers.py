"""Caffe's six update rules (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) on TensorFlow variables."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from firescale.caffe.solver import HISTORY_BLOBS, SolverConfig


def clip_gradients(grads: Sequence[tf.Tensor], threshold: float, iter_size: int = 1) -> list[tf.Tensor]:
    """Caffe's ClipGradients, before Normalize: when the joint L2 norm of the accumulated gradients
    (`iter_size` x the normalised `grads`) exceeds `threshold`, scale them all by threshold / norm."""
    l2norm = float(iter_size) * tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads]))
    scale = tf.where(l2norm > threshold, threshold / tf.maximum(l2norm, 1e-30), tf.constant(1.0))
    return [g * scale for g in grads]


class CaffeSolver:
    """Applies Caffe's regularisation and update rule to a list of parameters, keeping Caffe's history blobs.

    The gradients handed to `apply` are already normalised (the mean over the global batch and
    `iter_size`), as after Caffe's `Normalize`.  In Caffe's SGDSolver::ApplyUpdate order: clip first,
    on the gradients as they are before Normalize (accumulated over `iter_size` batches, each the
    batch's mean: `iter_size` times ours), all parameters together by their joint L2 norm; then per
    parameter add weight decay (L2: `decay * w`, L1: `decay * sign(w)`, with `decay = weight_decay *
    decay_mult`), compute the update with `local_rate = rate * lr_mult` and subtract it from the weights.
    """

    def __init__(self, config: SolverConfig, params: Sequence[tf.Variable], names: Sequence[str],
                 lr_mults: Sequence[float] | None = None, decay_mults: Sequence[float] | None = None) -> None:
        self.config = config
        self.params = list(params)
        self.names = list(names)
        n = len(self.params)
        self.lr_mults = [float(m) for m in (lr_mults or [1.0] * n)]
        self.decay_mults = [float(m) for m in (decay_mults or [1.0] * n)]
        # Each history blob lives on its parameter's device (several when the net is split by layers).
        self.history = [_zeros_beside(p) for p in self.params]
        # AdaDelta keeps the history of updates, Adam the second moment, in a second set of blobs.
        self.update_history = ([_zeros_beside(p) for p in self.params]
                               if HISTORY_BLOBS[config.type] == 2 else [])

    # ------------------------------------------------------------ the update
    def apply(self, grads: Sequence[tf.Tensor], rate: tf.Tensor, iteration: tf.Tensor) -> None:
        """One update with learning rate `rate` (float32) at 0-based `iteration` (int64); traceable."""
        c = self.config
        grads = [tf.convert_to_tensor(g, tf.float32) for g in grads]
        if c.clip_gradients >= 0:
            grads = clip_gradients(grads, c.clip_gradients, c.iter_size)
        for i, (w, g) in enumerate(zip(self.params, grads)):
            # On the parameter's device, under its layer's name (the memory probe reads the scope).
            with tf.device(w.device), tf.name_scope(self.names[i]):
                g = self._regularize(w, g, self.decay_mults[i])
                local_rate = rate * tf.constant(self.lr_mults[i], tf.float32)
                update = self._update_value(i, g, local_rate, iteration)
                w.assign_sub(update)

    def _regularize(self, w: tf.Variable, g: tf.Tensor, decay_mult: float) -> tf.Tensor:
        local_decay = self.config.weight_decay * decay_mult
        if local_decay == 0:
            return g
        if self.config.regularization_type == "L2":
            return g + tf.constant(local_decay, tf.float32) * w
        return g + tf.constant(local_decay, tf.float32) * tf.sign(w)

    def _update_value(self, i: int, g: tf.Tensor, local_rate: tf.Tensor, iteration: tf.Tensor) -> tf.Tensor:
        c = self.config
        h = self.history[i]
        f32 = lambda x: tf.constant(x, tf.float32)  # noqa: E731
        if c.type == "SGD":
            h.assign(local_rate * g + f32(c.momentum) * h)
            return h.read_value()
        if c.type == "Nesterov":
            previous = h.read_value()
            h.assign(local_rate * g + f32(c.momentum) * previous)
            return f32(1.0 + c.momentum) * h - f32(c.momentum) * previous
        if c.type == "AdaGrad":
            h.assign_add(tf.square(g))
            return local_rate * (g / (tf.sqrt(h) + f32(c.delta)))
        if c.type == "RMSProp":
            h.assign(f32(1.0 - c.rms_decay) * tf.square(g) + f32(c.rms_decay) * h)
            return local_rate * (g / (tf.sqrt(h) + f32(c.delta)))
        if c.type == "AdaDelta":
            u = self.update_history[i]
            h.assign(f32(1.0 - c.momentum) * tf.square(g) + f32(c.momentum) * h)
            step = g * tf.sqrt((u + f32(c.delta)) / (h + f32(c.delta)))
            u.assign(f32(1.0 - c.momentum) * tf.square(step) + f32(c.momentum) * u)
            return local_rate * step
        if c.type == "Adam":
            v = self.update_history[i]
            b1, b2 = c.momentum, c.momentum2
            t = tf.cast(iteration + 1, tf.float64)
            correction = tf.cast(tf.sqrt(1.0 - tf.pow(tf.constant(b2, tf.float64), t))
                                 / (1.0 - tf.pow(tf.constant(b1, tf.float64), t)), tf.float32)
            h.assign(f32(1.0 - b1) * g + f32(b1) * h)
            v.assign(f32(1.0 - b2) * tf.square(g) + f32(b2) * v)
            return local_rate * correction * (h / (tf.sqrt(v) + f32(c.delta)))
        raise ValueError(f"unknown solver type {c.type!r}")

    # ------------------------------------------------------------ state for snapshots
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Caffe's history blobs as NumPy arrays keyed `history/<param>` and `update_history/<param>`."""
        out = {f"history/{n}": h.numpy() for n, h in zip(self.names, self.history)}
        out.update({f"update_history/{n}": u.numpy() for n, u in zip(self.names, self.update_history)})
        return out

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore the history blobs written by `state_arrays` (shapes must match)."""
        pairs = [(f"history/{n}", h) for n, h in zip(self.names, self.history)]
        pairs += [(f"update_history/{n}", u) for n, u in zip(self.names, self.update_history)]
        for key, var in pairs:
            if key not in arrays:
                raise KeyError(key)
            var.assign(arrays[key])


def _zeros_beside(param: tf.Variable) -> tf.Variable:
    """A zero history blob shaped like `param`, on the same device."""
    with tf.device(param.device):
        return tf.Variable(tf.zeros_like(param), trainable=False)
