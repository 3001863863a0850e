"""The six Caffe update rules against a NumPy reference written from the Caffe solver documentation."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from firescale.caffe.lr_policies import learning_rate  # noqa: E402
from firescale.caffe.solver import solver_from_mapping  # noqa: E402
from firescale.train.tensorflow.solvers import CaffeSolver  # noqa: E402


def reference_steps(cfg, w0, grads, lr_mult, decay_mult):
    """Caffe's ComputeUpdateValue in float64: decay added to the gradient, then the method's rule."""
    w = [x.astype(np.float64) for x in w0]
    hist = [np.zeros_like(x) for x in w]
    hist2 = [np.zeros_like(x) for x in w]
    for it, step_grads in enumerate(grads):
        rate = learning_rate(cfg, it)
        for i, g in enumerate(step_grads):
            g = g.astype(np.float64)
            decay = cfg.weight_decay * decay_mult[i]
            g = g + decay * (w[i] if cfg.regularization_type == "L2" else np.sign(w[i]))
            alpha = rate * lr_mult[i]
            mu, eps = cfg.momentum, cfg.delta
            if cfg.type == "SGD":      # V = mu V - alpha grad; W += V
                hist[i] = mu * hist[i] - alpha * g
                w[i] = w[i] + hist[i]
            elif cfg.type == "Nesterov":  # V' = mu V - alpha grad; W += (1 + mu) V' - mu V
                v_new = mu * hist[i] - alpha * g
                w[i] = w[i] + (1 + mu) * v_new - mu * hist[i]
                hist[i] = v_new
            elif cfg.type == "AdaGrad":  # W -= alpha g / (sqrt(sum g^2) + delta)
                hist[i] = hist[i] + g * g
                w[i] = w[i] - alpha * g / (np.sqrt(hist[i]) + eps)
            elif cfg.type == "RMSProp":  # MS = d MS + (1 - d) g^2; W -= alpha g / (sqrt(MS) + delta)
                hist[i] = cfg.rms_decay * hist[i] + (1 - cfg.rms_decay) * g * g
                w[i] = w[i] - alpha * g / (np.sqrt(hist[i]) + eps)
            elif cfg.type == "AdaDelta":  # v = RMS(v_prev) / RMS(g) g; W -= alpha v
                hist[i] = mu * hist[i] + (1 - mu) * g * g
                v = np.sqrt(hist2[i] + eps) / np.sqrt(hist[i] + eps) * g
                hist2[i] = mu * hist2[i] + (1 - mu) * v * v
                w[i] = w[i] - alpha * v
            elif cfg.type == "Adam":
                b1, b2, t = cfg.momentum, cfg.momentum2, it + 1
                hist[i] = b1 * hist[i] + (1 - b1) * g
                hist2[i] = b2 * hist2[i] + (1 - b2) * g * g
                w[i] = w[i] - alpha * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * hist[i] / (np.sqrt(hist2[i]) + eps)
    return w


CASES = [
    {"type": "SGD", "momentum": 0.9, "weight_decay": 0.0005},
    {"type": "SGD", "momentum": 0.0, "weight_decay": 0.01, "regularization_type": "L1"},
    {"type": "Nesterov", "momentum": 0.95, "weight_decay": 0.001},
    {"type": "AdaGrad", "weight_decay": 0.0005, "delta": 1e-7},
    {"type": "RMSProp", "rms_decay": 0.98, "weight_decay": 0.0005, "delta": 1e-6},
    {"type": "AdaDelta", "momentum": 0.95, "delta": 1e-6, "base_lr": 1.0, "weight_decay": 0.0005},
    {"type": "Adam", "momentum": 0.9, "momentum2": 0.999, "base_lr": 0.001, "regularization_type": "L1",
     "weight_decay": 0.001},
]


@pytest.mark.parametrize("extra", CASES, ids=[f"{c['type']}-{c.get('regularization_type', 'L2')}" for c in CASES])
def test_update_rule_matches_numpy_reference(extra):
    raw = {"base_lr": 0.05, "max_iter": 100, "lr_policy": "step", "gamma": 0.5, "stepsize": 2, **extra}
    cfg = solver_from_mapping(raw)
    rng = np.random.default_rng(3)
    w0 = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)]
    grads = [[rng.normal(size=x.shape).astype(np.float32) for x in w0] for _ in range(6)]
    lr_mult, decay_mult = [1.0, 2.0], [1.0, 0.0]
    params = [tf.Variable(x) for x in w0]
    solver = CaffeSolver(cfg, params, ["ip/weights", "ip/bias"], lr_mult, decay_mult)
    for it, g in enumerate(grads):
        solver.apply([tf.constant(x) for x in g], tf.constant(learning_rate(cfg, it), tf.float32),
                     tf.constant(it, tf.int64))
    expected = reference_steps(cfg, w0, grads, lr_mult, decay_mult)
    for got, want, start in zip(params, expected, w0):
        assert not np.allclose(got.numpy(), start)  # the weights moved
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-6)


def test_solver_state_round_trip_continues_identically():
    cfg = solver_from_mapping({"type": "Adam", "base_lr": 0.01, "max_iter": 10, "momentum": 0.9})
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(5,)).astype(np.float32)
    grads = [rng.normal(size=(5,)).astype(np.float32) for _ in range(4)]
    a = tf.Variable(w0)
    sa = CaffeSolver(cfg, [a], ["p"])
    for it, g in enumerate(grads):
        sa.apply([tf.constant(g)], tf.constant(0.01), tf.constant(it, tf.int64))
    b = tf.Variable(w0)
    sb = CaffeSolver(cfg, [b], ["p"])
    for it, g in enumerate(grads[:2]):
        sb.apply([tf.constant(g)], tf.constant(0.01), tf.constant(it, tf.int64))
    state, weights = sb.state_arrays(), b.numpy()
    c = tf.Variable(np.zeros(5, np.float32))
    sc = CaffeSolver(cfg, [c], ["p"])
    c.assign(weights)
    sc.load_state_arrays(state)
    assert set(state) == {"history/p", "update_history/p"}
    for it, g in enumerate(grads[2:], start=2):
        sc.apply([tf.constant(g)], tf.constant(0.01), tf.constant(it, tf.int64))
    assert np.array_equal(c.numpy(), a.numpy())


def test_clip_gradients_acts_before_the_iter_size_normalisation():
    """Caffe clips the gradients accumulated over iter_size batches, then divides by iter_size: with a
    threshold between the normalised norm and the accumulated one, only Caffe's order clips."""
    rng = np.random.default_rng(5)
    w0 = [rng.normal(size=(5,)).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)]
    g = [rng.normal(size=x.shape).astype(np.float32) for x in w0]
    norm = float(np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g)))
    iter_size, clip = 4, 2.0 * norm          # the normalised norm is under it, the accumulated one over it
    cfg = solver_from_mapping({"base_lr": 0.1, "max_iter": 10, "iter_size": iter_size, "clip_gradients": clip})
    params = [tf.Variable(x) for x in w0]
    CaffeSolver(cfg, params, ["a", "b"]).apply([tf.constant(x) for x in g], tf.constant(0.1), tf.constant(0, tf.int64))
    accumulated = [x.astype(np.float64) * iter_size for x in g]
    clipped = [x * clip / (iter_size * norm) for x in accumulated]     # Caffe's ClipGradients
    expected = [w - 0.1 * c / iter_size for w, c in zip(w0, clipped)]  # then Normalize, then SGD
    for got, want, start, grad in zip(params, expected, w0, g):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(got.numpy(), start - 0.1 * grad)         # clipping changed the step
