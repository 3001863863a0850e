"""Confidence intervals over repeats: Welch's for a difference of means, the delta method for a ratio."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

LEVEL = 0.95   # two-sided confidence level of every interval in the report


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval at `level`, with the degrees of freedom of its t quantile."""

    low: float
    high: float
    level: float
    df: float

    def scaled(self, factor: float) -> Interval:
        return Interval(self.low * factor, self.high * factor, self.level, self.df)


def _t_quantile(level: float, df: float) -> float:
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2.0, df))


def _welch(se2_a: float, n_a: int, se2_b: float, n_b: int) -> float:
    """Welch–Satterthwaite degrees of freedom of two squared standard errors."""
    denominator = se2_a ** 2 / (n_a - 1) + se2_b ** 2 / (n_b - 1)
    return (se2_a + se2_b) ** 2 / denominator if denominator > 0 else math.inf


def mean_difference(a: list[float], b: list[float], level: float = LEVEL) -> Interval | None:
    """Welch's interval for mean(a) - mean(b); None when either side has fewer than two values."""
    if len(a) < 2 or len(b) < 2:
        return None
    se2_a, se2_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = _welch(se2_a, len(a), se2_b, len(b))
    half = _t_quantile(level, df) * math.sqrt(se2_a + se2_b) if se2_a + se2_b > 0 else 0.0
    diff = statistics.fmean(a) - statistics.fmean(b)
    return Interval(diff - half, diff + half, level, df)


def mean_ratio(num: list[float], den: list[float], level: float = LEVEL) -> Interval | None:
    """An interval for mean(num) / mean(den) (all positive): the delta method on the log of the ratio,
    log(mean) having the squared relative standard error s^2 / (n mean^2), with Welch's degrees of
    freedom; None when either side has fewer than two values."""
    if len(num) < 2 or len(den) < 2:
        return None
    m_n, m_d = statistics.fmean(num), statistics.fmean(den)
    rel_n = statistics.variance(num) / (len(num) * m_n ** 2)
    rel_d = statistics.variance(den) / (len(den) * m_d ** 2)
    df = _welch(rel_n, len(num), rel_d, len(den))
    half = _t_quantile(level, df) * math.sqrt(rel_n + rel_d) if rel_n + rel_d > 0 else 0.0
    ratio = m_n / m_d
    return Interval(ratio * math.exp(-half), ratio * math.exp(half), level, df)
