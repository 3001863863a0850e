"""The six Caffe update rules against a NumPy reference written from the Caffe solver documentation, on both
backends: the TensorFlow solver on variables, the PyTorch solver on a net's blobs (in its layout, read back in the
trainer's), so that one reference checks both."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from firescale.caffe.lr_policies import learning_rate
from firescale.caffe.solver import SolverConfig, solver_from_mapping
from firescale.nets.spec import FC, NetSpec, Softmax

# One InnerProduct of 4 inputs and 3 outputs: its weights (4, 3) in the trainer's layout, (3, 4) in torch's.
NET = NetSpec("ip", (1, 1, 4), 3, (FC("ip", 3), Softmax()))
NAMES = ["ip/weights", "ip/bias"]


@dataclass
class Solver:
    """One backend's solver over NET's two blobs, seen in the trainer's layout."""

    apply: Callable[[list[np.ndarray], float, int], None]
    weights: Callable[[], list[np.ndarray]]
    state_arrays: Callable[[], dict[str, np.ndarray]]
    load_state_arrays: Callable[[dict[str, np.ndarray]], None]
    set_weights: Callable[[list[np.ndarray]], None]


def tensorflow_solver(cfg: SolverConfig, w0: list[np.ndarray], lr_mult=None, decay_mult=None) -> Solver:
    import tensorflow as tf

    from firescale.train.tensorflow.solvers import CaffeSolver

    params = [tf.Variable(x) for x in w0]
    solver = CaffeSolver(cfg, params, NAMES, lr_mult, decay_mult)

    def apply(grads: list[np.ndarray], rate: float, iteration: int) -> None:
        solver.apply([tf.constant(g) for g in grads], tf.constant(rate, tf.float32), tf.constant(iteration, tf.int64))

    def set_weights(ws: list[np.ndarray]) -> None:
        for p, w in zip(params, ws):
            p.assign(w)

    return Solver(apply, lambda: [p.numpy() for p in params], solver.state_arrays, solver.load_state_arrays,
                  set_weights)


def pytorch_solver(cfg: SolverConfig, w0: list[np.ndarray], lr_mult=None, decay_mult=None) -> Solver:
    import torch

    from firescale.train.torch.nets import CaffeNet, from_trainer_layout
    from firescale.train.torch.solvers import CaffeSolver

    net = CaffeNet(NET, seed=0)
    net.write_params(dict(zip(NAMES, w0)))
    solver = CaffeSolver(cfg, net, lr_mult, decay_mult)

    def apply(grads: list[np.ndarray], rate: float, iteration: int) -> None:
        solver.apply([torch.from_numpy(from_trainer_layout(net, n, g)) for n, g in zip(NAMES, grads)], rate, iteration)

    return Solver(apply, lambda: [net.read_params()[n] for n in NAMES], solver.state_arrays,
                  solver.load_state_arrays, lambda ws: net.write_params(dict(zip(NAMES, ws))))


BACKENDS = [pytest.param(tensorflow_solver, id="tensorflow", marks=pytest.mark.tensorflow),
            pytest.param(pytorch_solver, id="pytorch", marks=pytest.mark.pytorch)]


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("extra", CASES, ids=[f"{c['type']}-{c.get('regularization_type', 'L2')}" for c in CASES])
def test_update_rule_matches_numpy_reference(extra, backend):
    raw = {"base_lr": 0.05, "max_iter": 100, "lr_policy": "step", "gamma": 0.5, "stepsize": 2, **extra}
    cfg = solver_from_mapping(raw)
    rng = np.random.default_rng(3)
    w0 = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)]
    grads = [[rng.normal(size=x.shape).astype(np.float32) for x in w0] for _ in range(6)]
    lr_mult, decay_mult = [1.0, 2.0], [1.0, 0.0]
    solver = backend(cfg, w0, lr_mult, decay_mult)
    for it, g in enumerate(grads):
        solver.apply(g, learning_rate(cfg, it), it)
    expected = reference_steps(cfg, w0, grads, lr_mult, decay_mult)
    for got, want, start in zip(solver.weights(), expected, w0):
        assert not np.allclose(got, start)  # the weights moved
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_solver_state_round_trip_continues_identically(backend):
    cfg = solver_from_mapping({"type": "Adam", "base_lr": 0.01, "max_iter": 10, "momentum": 0.9})
    rng = np.random.default_rng(0)
    w0 = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)]
    grads = [[rng.normal(size=x.shape).astype(np.float32) for x in w0] for _ in range(4)]
    a = backend(cfg, w0)
    for it, g in enumerate(grads):
        a.apply(g, 0.01, it)
    b = backend(cfg, w0)
    for it, g in enumerate(grads[:2]):
        b.apply(g, 0.01, it)
    state, weights = b.state_arrays(), b.weights()
    c = backend(cfg, [np.zeros_like(x) for x in w0])
    c.set_weights(weights)
    c.load_state_arrays(state)
    assert set(state) == {f"{kind}/{n}" for kind in ("history", "update_history") for n in NAMES}
    assert [state[f"history/{n}"].shape for n in NAMES] == [(4, 3), (3,)]    # the trainer's layout
    for it, g in enumerate(grads[2:], start=2):
        c.apply(g, 0.01, it)
    for got, want in zip(c.weights(), a.weights()):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clip_gradients_acts_before_the_iter_size_normalisation(backend):
    """Caffe clips the gradients accumulated over iter_size batches, then divides by iter_size: with a
    threshold between the normalised norm and the accumulated one, only Caffe's order clips."""
    rng = np.random.default_rng(5)
    w0 = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)]
    g = [rng.normal(size=x.shape).astype(np.float32) for x in w0]
    norm = float(np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g)))
    iter_size, clip = 4, 2.0 * norm          # the normalised norm is under it, the accumulated one over it
    cfg = solver_from_mapping({"base_lr": 0.1, "max_iter": 10, "iter_size": iter_size, "clip_gradients": clip})
    solver = backend(cfg, w0)
    solver.apply(g, 0.1, 0)
    accumulated = [x.astype(np.float64) * iter_size for x in g]
    clipped = [x * clip / (iter_size * norm) for x in accumulated]     # Caffe's ClipGradients
    expected = [w - 0.1 * c / iter_size for w, c in zip(w0, clipped)]  # then Normalize, then SGD
    for got, want, start, grad in zip(solver.weights(), expected, w0, g):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(got, start - 0.1 * grad)         # clipping changed the step


@pytest.mark.tensorflow
@pytest.mark.pytorch
@pytest.mark.parametrize("extra", CASES[::2] + CASES[5:6] + [{"type": "SGD", "momentum": 0.9, "clip_gradients": 1.0}],
                         ids=["SGD", "Nesterov", "RMSProp", "Adam", "AdaDelta", "SGD-clip"])
def test_both_backends_step_alike_and_read_each_others_state(extra):
    """The backends do the same float32 arithmetic in the same order: over 20 steps their weights and history
    blobs agree to a float32 rounding or two (measured: SGD, Nesterov, Adam bitwise; RMSProp 5e-7, AdaDelta's
    history 2e-12, clipping 3e-8, from TensorFlow's square root and sums in another order), and each takes the
    other's solver state exactly (the trainer's layout both ways)."""
    cfg = solver_from_mapping({"base_lr": 0.05, "max_iter": 100, "lr_policy": "step", "gamma": 0.5, "stepsize": 2,
                               **extra})
    rng = np.random.default_rng(3)
    w0 = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)]
    grads = [[rng.normal(size=x.shape).astype(np.float32) for x in w0] for _ in range(20)]
    tf_solver = tensorflow_solver(cfg, w0, [1.0, 2.0], [1.0, 0.0])
    torch_solver = pytorch_solver(cfg, w0, [1.0, 2.0], [1.0, 0.0])
    for it, g in enumerate(grads):
        tf_solver.apply(g, learning_rate(cfg, it), it)
        torch_solver.apply(g, learning_rate(cfg, it), it)
    tf_state, torch_state = tf_solver.state_arrays(), torch_solver.state_arrays()
    assert set(tf_state) == set(torch_state)
    for got, want in zip(torch_solver.weights(), tf_solver.weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for key in tf_state:
        np.testing.assert_allclose(torch_state[key], tf_state[key], rtol=1e-6, atol=1e-9, err_msg=key)
    torch_solver.load_state_arrays(tf_state)
    tf_solver.load_state_arrays(torch_state)
    assert all(np.array_equal(torch_solver.state_arrays()[k], tf_state[k]) for k in tf_state)
    assert all(np.array_equal(tf_solver.state_arrays()[k], torch_state[k]) for k in tf_state)
