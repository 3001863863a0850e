"""Caffe's learning-rate policies: fixed, step, exp, inv, multistep, poly, sigmoid."""
from __future__ import annotations

import math

from .solver_config import SolverConfig


def learning_rate(config: SolverConfig, iteration: int) -> float:
    """The rate Caffe's Solver::GetLearningRate gives at `iteration` (0-based, before the update)."""
    base, it, policy = config.base_lr, iteration, config.lr_policy
    if policy == "fixed":
        return base
    if policy == "step":
        assert config.stepsize and config.gamma is not None
        return base * config.gamma ** (it // config.stepsize)
    if policy == "exp":
        assert config.gamma is not None
        return base * config.gamma ** it
    if policy == "inv":
        assert config.gamma is not None and config.power is not None
        return base * (1.0 + config.gamma * it) ** (-config.power)
    if policy == "multistep":
        assert config.gamma is not None
        current_step = sum(1 for value in config.stepvalue if it >= value)
        return base * config.gamma ** current_step
    if policy == "poly":
        assert config.power is not None
        return base * (1.0 - it / config.max_iter) ** config.power
    if policy == "sigmoid":
        assert config.gamma is not None and config.stepsize is not None
        exponent = -config.gamma * (it - config.stepsize)
        return 0.0 if exponent > 700 else base * (1.0 / (1.0 + math.exp(exponent)))
    raise ValueError(f"unknown lr_policy {policy!r}")
