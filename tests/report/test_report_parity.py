"""The parity verdict at the edges of the tolerance, alone and through the report's rows."""
from __future__ import annotations

import pytest

from firescale.report.parity import check_parity
from firescale.report.summary import summarize


@pytest.mark.parametrize(
    ("top1", "baseline", "tolerance", "verdict"),
    [
        (0.93, 0.95, 0.02, "MATCHES"),                      # exactly at the tolerance
        (0.9301, 0.95, 0.02, "MATCHES"),                    # just inside
        (0.9299, 0.95, 0.02, "BELOW BASELINE by 2.01 pts"),  # just outside: enough decimals to show it
        (0.92, 0.95, 0.02, "BELOW BASELINE by 3.0 pts"),
        (0.97, 0.95, 0.02, "MATCHES"),                      # above the baseline
        (0.95, 0.95, 0.0, "MATCHES"),                       # zero tolerance, equal
        (0.9499, 0.95, 0.0, "BELOW BASELINE by 0.01 pts"),
        (0.41, 0.51, 0.1, "MATCHES"),                       # 0.51 - 0.1 is 0.41000000000000003 in floats
        (0.47, 0.52, 0.05, "MATCHES"),                      # 104/200 - 0.05 vs 94/200, same rounding trap
    ],
)
def test_verdict_at_the_edges(top1, baseline, tolerance, verdict):
    parity = check_parity(top1, baseline, tolerance)
    assert parity.verdict == verdict
    assert parity.matches == (verdict == "MATCHES")


def test_delta_is_in_points_and_signed():
    assert check_parity(0.92, 0.95, 0.02).delta_pts == pytest.approx(-3.0)
    assert check_parity(0.97, 0.95, 0.02).delta_pts == pytest.approx(2.0)


def test_negative_tolerance_is_refused():
    with pytest.raises(ValueError):
        check_parity(0.9, 0.9, -0.01)


@pytest.mark.parametrize(("top1", "verdict"), [(0.93, "MATCHES"), (0.9301, "MATCHES"),
                                              (0.9299, "BELOW BASELINE by 2.01 pts")])
def test_row_verdict_at_the_edges(edited, top1, verdict):
    """A 2-GPU run whose judged eval sits at, inside and outside baseline 0.95 - tolerance 0.02."""
    evals = [{"iter": 100, "epoch": 5.0, "wall_s": 30.0, "top1": 0.80, "top5": 0.95, "loss": 1.0},
             {"iter": 200, "epoch": 10.0, "wall_s": 60.0, "top1": top1, "top5": 0.99, "loss": 0.5}]
    runs = [edited("baseline"), edited("g2-b64-r0", train={"evals": evals, "reached_target": False,
                                                           "time_to_accuracy_s": None})]
    summary = summarize(runs, 0.02)
    row = next(r for r in summary.rows if not r.baseline)
    assert row.top1.mean == top1
    assert row.parity.verdict == verdict


def test_verdict_judges_the_mean_of_repeats(edited):
    """Repeats at 0.92 and 0.94 average 0.93: exactly at the tolerance, so the row matches."""
    base = edited("baseline")
    r0 = edited("g2-b64-r0", train={"evals": [{"iter": 200, "epoch": 10.0, "wall_s": 60.0, "top1": 0.92,
                                               "top5": 0.99, "loss": 0.5}], "reached_target": False,
                                    "time_to_accuracy_s": None})
    r1 = edited("g2-b64-r1", train={"evals": [{"iter": 200, "epoch": 10.0, "wall_s": 80.0, "top1": 0.94,
                                               "top5": 0.99, "loss": 0.5}], "reached_target": True,
                                    "time_to_accuracy_s": 80.0})
    row = next(r for r in summarize([base, r0, r1], 0.02).rows if not r.baseline)
    assert row.top1.mean == pytest.approx(0.93)
    assert row.parity.verdict == "MATCHES"
