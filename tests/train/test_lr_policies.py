"""Caffe's learning-rate policies, checked against the formulas with hand-picked numbers."""
from __future__ import annotations

import math

import pytest

from firescale.caffe.lr_policies import learning_rate
from firescale.caffe.solver import solver_from_mapping


def cfg(**kw):
    return solver_from_mapping({"base_lr": 0.1, "max_iter": 1000, **kw})


@pytest.mark.parametrize("kw, it, expected", [
    ({"lr_policy": "fixed"}, 999, 0.1),
    ({"lr_policy": "step", "gamma": 0.1, "stepsize": 100}, 99, 0.1),
    ({"lr_policy": "step", "gamma": 0.1, "stepsize": 100}, 100, 0.01),
    ({"lr_policy": "step", "gamma": 0.1, "stepsize": 100}, 250, 0.001),
    ({"lr_policy": "exp", "gamma": 0.99}, 10, 0.1 * 0.99 ** 10),
    ({"lr_policy": "inv", "gamma": 1e-4, "power": 0.75}, 5000, 0.1 * (1 + 0.5) ** -0.75),
    ({"lr_policy": "multistep", "gamma": 0.5, "stepvalue": [10, 30]}, 9, 0.1),
    ({"lr_policy": "multistep", "gamma": 0.5, "stepvalue": [10, 30]}, 10, 0.05),
    ({"lr_policy": "multistep", "gamma": 0.5, "stepvalue": [10, 30]}, 30, 0.025),
    ({"lr_policy": "poly", "power": 2.0}, 250, 0.1 * 0.75 ** 2),
    ({"lr_policy": "poly", "power": 1.0}, 1000, 0.0),
    ({"lr_policy": "sigmoid", "gamma": -0.05, "stepsize": 200}, 200, 0.05),
    ({"lr_policy": "sigmoid", "gamma": -0.05, "stepsize": 200}, 100, 0.1 / (1 + math.exp(-0.05 * 100))),
])
def test_policy(kw, it, expected):
    assert learning_rate(cfg(**kw), it) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("kw", [
    {"lr_policy": "step", "gamma": 0.1, "stepsize": 400},
    {"lr_policy": "multistep", "gamma": 0.5, "stepvalue": [200, 600, 1000]},
    {"lr_policy": "exp", "gamma": 0.999},
    {"lr_policy": "inv", "gamma": 1e-3, "power": 0.75},
    {"lr_policy": "poly", "power": 0.5},
    {"lr_policy": "sigmoid", "gamma": -0.01, "stepsize": 600},
])
def test_a_schedule_at_four_times_the_batch_is_the_same_function_of_epochs(kw):
    from firescale.caffe.lr_policies import schedule_for_batch

    base = solver_from_mapping({"base_lr": 0.1, "max_iter": 1200, "test_interval": 100, **kw})
    big = solver_from_mapping({"base_lr": 0.1, "max_iter": 1200, "test_interval": 100, **kw,
                               **schedule_for_batch(base, 0.25, 300)})
    assert big.max_iter == 300 and big.test_interval == 25
    for it in (0, 100, 396, 404, 800, 1196):   # iteration it at the baseline batch is it / 4 at four times it
        assert learning_rate(big, it // 4) == pytest.approx(learning_rate(base, it // 4 * 4), rel=1e-9), it
