"""Caffe's learning-rate policies (fixed, step, exp, inv, multistep, poly, sigmoid), also at another batch."""
from __future__ import annotations

import math
from typing import Any

from firescale.caffe.solver import SolverConfig


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


def schedule_for_batch(config: SolverConfig, ratio: float, max_iter: int) -> dict[str, Any]:
    """The solver keys that change when its schedule, written for one batch, runs at a batch 1/ratio
    as large (ratio = baseline batch / batch) for `max_iter` iterations: every iteration count of the
    policy scales by `ratio` and every per-iteration rate by its inverse, so that the learning rate
    is the same function of epochs.  Returns only the keys whose value changes.

    step: stepsize; multistep: stepvalue; sigmoid: stepsize (the midpoint) and gamma (the slope);
    exp: gamma ** (1 / ratio); inv: gamma / ratio; poly follows max_iter by itself; test_interval
    scales too (rounded up), so evaluations fall at the same epochs.
    """
    if ratio <= 0 or max_iter < 1:
        raise ValueError(f"ratio {ratio} and max_iter {max_iter} must be positive")
    count = lambda n: max(1, round(n * ratio))  # noqa: E731 - an iteration count, at least one
    new: dict[str, Any] = {"max_iter": int(max_iter)}
    policy = config.lr_policy
    if config.stepsize is not None and policy in ("step", "sigmoid"):
        new["stepsize"] = count(config.stepsize)
    if policy == "multistep":
        new["stepvalue"] = [round(v * ratio) for v in config.stepvalue]
    if config.gamma is not None and policy == "exp":
        new["gamma"] = config.gamma ** (1.0 / ratio)
    if config.gamma is not None and policy in ("inv", "sigmoid"):
        new["gamma"] = config.gamma / ratio
    if config.test_interval:  # rounded up: never more evaluations per epoch than at the baseline batch
        new["test_interval"] = max(1, math.ceil(config.test_interval * ratio))
    return {k: v for k, v in new.items() if v != getattr(config, k)}


def current_step(config: SolverConfig, iteration: int) -> int:
    """Caffe's Solver::current_step_ after `iteration` updates (recorded in its SolverState): the step
    count of the rate of the last update for the step and multistep policies, 0 for the others."""
    last = iteration - 1
    if last < 0:
        return 0
    if config.lr_policy == "step" and config.stepsize:
        return last // config.stepsize
    if config.lr_policy == "multistep":
        return sum(1 for value in config.stepvalue if last >= value)
    return 0
