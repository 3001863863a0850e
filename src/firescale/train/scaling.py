"""Batch and learning-rate scaling for sweeps: per-rank or total batch, none/linear/sqrt LR rules, warm-up."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from firescale.errors import FirescaleError

LR_SCALING_RULES = ("none", "linear", "sqrt")


@dataclass(frozen=True)
class BatchScaling:
    """How one run splits its batch and scales its learning rate (recorded in the result)."""

    ranks: int
    batch_per_rank: int
    total_batch: int           # images per forward/backward across all ranks (ranks x batch_per_rank)
    iter_size: int             # Caffe's gradient accumulation: one update averages iter_size batches
    effective_batch: int       # images per update: total_batch x iter_size
    reference_batch: int       # the batch the solver's base_lr was set for
    lr_scaling: str            # none | linear | sqrt
    lr_scale: float            # multiplies base_lr: 1, B/B_ref or sqrt(B/B_ref)
    warmup_iters: int          # linear warm-up length in updates (0: none)
    warmup_start_factor: float  # the warm-up multiplier at iteration 0
    warmup_start_lr: float | None = None  # the rate warm-up starts from, when given (Goyal et al.: the unscaled one)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def warmup_factor(self, iteration: int) -> float:
        """Multiplier of the policy's rate at 0-based `iteration`: a linear ramp to 1 over warmup_iters."""
        if iteration >= self.warmup_iters:
            return 1.0
        start = self.warmup_start_factor
        return start + (1.0 - start) * iteration / self.warmup_iters


def plan_batches(ranks: int, *, batch_per_rank: int | None = None, total_batch: int | None = None,
                 iter_size: int = 1, reference_batch: int | None = None, lr_scaling: str = "none",
                 warmup_iters: int = 0, base_lr: float | None = None,
                 warmup_start_lr: float | None = None) -> BatchScaling:
    """Resolve `--batch-per-rank b` or `--total-batch B` for `ranks` ranks and the LR rule.

    The learning rate is scaled relative to `reference_batch` (default: the per-rank batch when the
    per-rank batch is given, as with one worker's tuned batch in weak scaling; the total batch when the
    total is given, so strong scaling keeps the rate).  FireCaffe: batch x4 -> LR x4 (linear).
    Warm-up (Goyal et al. 2017) starts from the unscaled rate and grows linearly to the full rate at
    `warmup_iters`: from `warmup_start_lr` when given (a sweep sets base_lr to the point's own rate and
    names the baseline's rate here), else from base_lr, 1/lr_scale of the scaled rate, else, without
    scaling, from 1/warmup_iters of it.  A start at or above the full rate needs no warm-up (factor 1).
    """
    if ranks < 1:
        raise FirescaleError(f"the number of ranks must be at least 1, not {ranks}")
    per_rank = _per_rank_batch(ranks, batch_per_rank, total_batch)
    total = per_rank * ranks
    if reference_batch is None:
        reference_batch = per_rank if batch_per_rank is not None else total
    if reference_batch < 1:
        raise FirescaleError(f"--reference-batch must be at least 1, not {reference_batch}")
    if lr_scaling not in LR_SCALING_RULES:
        raise FirescaleError(f"--lr-scaling must be one of {', '.join(LR_SCALING_RULES)}, not {lr_scaling!r}")
    if warmup_iters < 0:
        raise FirescaleError(f"--warmup-iters must not be negative, not {warmup_iters}")
    ratio = total * iter_size / reference_batch
    scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[lr_scaling]
    start = _warmup_start(scale, warmup_iters, base_lr, warmup_start_lr)
    return BatchScaling(ranks=ranks, batch_per_rank=per_rank, total_batch=total, iter_size=iter_size,
                     effective_batch=total * iter_size, reference_batch=reference_batch,
                     lr_scaling=lr_scaling, lr_scale=scale, warmup_iters=warmup_iters,
                     warmup_start_factor=start, warmup_start_lr=warmup_start_lr)


def _per_rank_batch(ranks: int, batch_per_rank: int | None, total_batch: int | None) -> int:
    if (batch_per_rank is None) == (total_batch is None):
        raise FirescaleError("give exactly one of --batch-per-rank and --total-batch")
    if batch_per_rank is not None:
        if batch_per_rank < 1:
            raise FirescaleError(f"--batch-per-rank must be at least 1, not {batch_per_rank}")
        return batch_per_rank
    assert total_batch is not None
    if total_batch < 1 or total_batch % ranks:
        raise FirescaleError(f"--total-batch {total_batch} must be a positive multiple of the "
                             f"{ranks} ranks so that every rank gets the same batch")
    return total_batch // ranks


def _warmup_start(scale: float, warmup_iters: int, base_lr: float | None, warmup_start_lr: float | None) -> float:
    """The warm-up multiplier at iteration 0 (see plan_batches)."""
    if warmup_start_lr is not None:
        if not warmup_start_lr > 0:
            raise FirescaleError(f"--warmup-start-lr must be positive, not {warmup_start_lr}")
        if base_lr is None or base_lr <= 0:
            raise FirescaleError("--warmup-start-lr needs the solver's base_lr to compare with")
        return min(1.0, warmup_start_lr / (base_lr * scale))
    if scale > 1.0:
        return 1.0 / scale
    return 1.0 / warmup_iters if warmup_iters else 1.0


@dataclass(frozen=True)
class BatchSchedule:
    """A run whose batch changes at given iterations (Oh and Lee's 16+ and 32+: train at 8, then go on at a
    larger batch); each phase has its own BatchScaling, its learning rate scaled by the same rule and reference."""

    phases: tuple[tuple[int, BatchScaling], ...]   # (first iteration, plan), the first at iteration 0

    def plan_at(self, iteration: int) -> BatchScaling:
        return [plan for start, plan in self.phases if start <= iteration][-1]

    def starts_at(self, iteration: int) -> bool:
        """Whether a new phase (another batch) begins at `iteration` (not the first phase)."""
        return any(start == iteration for start, _ in self.phases[1:])

    def samples_before(self, iteration: int) -> int:
        """Training samples the stream has given out before `iteration` (all ranks, iter_size included)."""
        total = 0
        for k, (start, plan) in enumerate(self.phases):
            end = self.phases[k + 1][0] if k + 1 < len(self.phases) else iteration
            total += max(0, min(end, iteration) - start) * plan.effective_batch
        return total

    def to_dict(self) -> list[dict[str, Any]]:
        return [{"iteration": start, "batch_per_rank": p.batch_per_rank, "total_batch": p.total_batch,
                 "effective_batch": p.effective_batch, "lr_scale": p.lr_scale} for start, p in self.phases]


def parse_batch_schedule(text: str) -> list[tuple[int, int]]:
    """`--batch-schedule 10000:16,15000:32`: from iteration 10000 the batch is 16, from 15000 it is 32."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        iteration, sep, batch = item.partition(":")
        if not sep or not iteration.strip().isdigit() or not batch.strip().isdigit():
            raise FirescaleError(f"--batch-schedule {text!r}: {item!r} is not ITERATION:BATCH, e.g. 10000:16")
        out.append((int(iteration), int(batch)))
    if not out or any(b <= a for (a, _), (b, _) in zip(out, out[1:])) or out[0][0] < 1:
        raise FirescaleError(f"--batch-schedule {text!r}: give ITERATION:BATCH pairs with iterations above 0, "
                             "strictly increasing")
    return out


def plan_schedule(ranks: int, changes: list[tuple[int, int]], *, batch_per_rank: int | None = None,
                  total_batch: int | None = None, reference_batch: int | None = None, **common: Any) -> BatchSchedule:
    """The run's BatchScaling from iteration 0 and one more at each (iteration, batch) change, the batch in
    the unit of the start (per rank, or total); the learning-rate reference stays the start's."""
    first = plan_batches(ranks, batch_per_rank=batch_per_rank, total_batch=total_batch,
                         reference_batch=reference_batch, **common)
    phases = [(0, first)]
    for iteration, batch in changes:
        per_rank, total = (batch, None) if batch_per_rank is not None else (None, batch)
        phases.append((iteration, plan_batches(ranks, batch_per_rank=per_rank, total_batch=total,
                                               reference_batch=first.reference_batch, **common)))
    return BatchSchedule(tuple(phases))
