"""The baseline parity check (FireCaffe 7.1, item 4): a scaled run must reach the single-GPU accuracy."""
from __future__ import annotations

from dataclasses import dataclass

# Accuracies are ratios of image counts; a difference this small is rounding, not a shortfall.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Parity:
    """A run's top-1 against the baseline's: matches when top1 >= baseline_top1 - tolerance."""

    top1: float
    baseline_top1: float
    tolerance: float
    matches: bool

    @property
    def delta_pts(self) -> float:
        """Top-1 minus the baseline's, in percentage points (negative: below the baseline)."""
        return (self.top1 - self.baseline_top1) * 100.0

    @property
    def verdict(self) -> str:
        """'MATCHES' or 'BELOW BASELINE by x.x pts', shown as is in every table."""
        if self.matches:
            return "MATCHES"
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
