"""The baseline parity check (FireCaffe 7.1, item 4): a scaled run must reach the single-GPU accuracy."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from firescale.report.stats import Interval, mean_difference

# Accuracies are ratios of image counts; a difference this small is rounding, not a shortfall.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Parity:
    """A point's top-1 against the baseline's, with the tolerance allowed below it.

    With repeats on both sides the verdict is a non-inferiority test: the point matches when the
    lower end of the confidence interval of Δ top-1 (point mean minus baseline mean) is at least
    −tolerance, falls below when its upper end is under −tolerance, and is undecided in between.
    With one run on either side there is no interval and the means are compared."""

    top1: float
    baseline_top1: float
    tolerance: float
    matches: bool
    interval: Interval | None = None     # of Δ top-1, as a fraction
    undecided: bool = False

    @property
    def delta_pts(self) -> float:
        """Top-1 minus the baseline's, in percentage points (negative: below the baseline)."""
        return (self.top1 - self.baseline_top1) * 100.0

    @property
    def verdict(self) -> str:
        """'MATCHES', 'UNDECIDED' or 'BELOW BASELINE by x.x pts', shown as is in every table."""
        if self.matches:
            return "MATCHES"
        if self.undecided:
            return "UNDECIDED"
        shortfall, tolerance = -self.delta_pts, self.tolerance * 100.0
        # Enough decimals that a shortfall just past the tolerance does not print as equal to it.
        for digits in (1, 2, 3, 4):
            if round(shortfall, digits) > round(tolerance, digits):
                break
        return f"BELOW BASELINE by {shortfall:.{digits}f} pts"


def check_parity(top1: float, baseline_top1: float, tolerance: float) -> Parity:
    """Judge `top1` against the baseline's top-1 with the experiment's tolerance (fractions, not percent)."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    matches = top1 >= baseline_top1 - tolerance - _EPSILON
    return Parity(float(top1), float(baseline_top1), float(tolerance), bool(matches))


def judge_parity(top1s: list[float], baseline_top1s: list[float], tolerance: float) -> Parity:
    """The point's repeats against the baseline's: a confidence interval of Δ top-1 against −tolerance
    when both have two or more runs, else the means compared (check_parity)."""
    mean, base = statistics.fmean(top1s), statistics.fmean(baseline_top1s)
    interval = mean_difference(top1s, baseline_top1s)
    if interval is None:
        return check_parity(mean, base, tolerance)
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    matches = interval.low >= -tolerance - _EPSILON
    below = interval.high < -tolerance - _EPSILON
    return Parity(mean, base, float(tolerance), matches, interval, undecided=not matches and not below)
