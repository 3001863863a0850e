"""The parity verdict at the edges of the tolerance, alone and through the report's rows."""
from __future__ import annotations

import copy
import math

import pytest
from report_records import raw_record

from firescale.report.parity import check_parity
from firescale.report.summary import summarize
from firescale.sweep.records import run_record_from_dict


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


def _runs(source, top1s, times):
    """Repeats of the fixture point `source` whose last evaluation is each top-1, reached at each time."""
    out = []
    for i, (top1, wall) in enumerate(zip(top1s, times)):
        data = copy.deepcopy(raw_record(source))
        name = (("baseline" if i == 0 else f"baseline-r{i}") if source == "baseline" else f"g2-b64-r{i}")
        data.update(point=name, repeat=i)
        data["train"].update(evals=[{"iter": 200, "epoch": 10.0, "wall_s": wall, "top1": top1, "top5": 0.99,
                                     "loss": 0.5}], train_time_s=wall, reached_target=False,
                             time_to_accuracy_s=None, target_top1=None)
        out.append(run_record_from_dict(data, name))
    return out


@pytest.mark.parametrize(("top1s", "verdict"), [
    ([0.945, 0.950, 0.955], "MATCHES"),         # Δ interval about [−1.1, +1.1] pts, above −2
    ([0.910, 0.915, 0.920], "BELOW BASELINE by 3.5 pts"),   # about [−4.6, −2.4]: wholly under −2
    ([0.925, 0.930, 0.935], "UNDECIDED"),       # about [−3.1, −0.9]: straddles −2
])
def test_the_verdict_is_a_confidence_interval_against_the_tolerance(top1s, verdict):
    base = _runs("baseline", [0.945, 0.950, 0.955], [100.0, 100.0, 100.0])
    point = _runs("g2-b64-r0", top1s, [50.0, 50.0, 50.0])
    row = next(r for r in summarize(base + point, 0.02).rows if not r.baseline)
    parity = row.parity
    assert parity.verdict == verdict and parity.interval is not None
    # Welch's interval by hand: equal spreads (sd 0.005, n 3 each) give df 4 and t 2.776
    half = 2.7764451 * (2 * 0.005 ** 2 / 3) ** 0.5
    mean = sum(top1s) / 3 - 0.95
    assert (parity.interval.low, parity.interval.high) == pytest.approx((mean - half, mean + half), abs=1e-7)
    assert parity.interval.df == pytest.approx(4.0)


def test_the_speedup_has_an_interval_over_the_repeats():
    base = _runs("baseline", [0.95] * 3, [100.0, 110.0, 90.0])
    point = _runs("g2-b64-r0", [0.95] * 3, [50.0, 55.0, 45.0])
    row = next(r for r in summarize(base + point, 0.02).rows if not r.baseline)
    interval = row.speedup_interval
    # both sides have a relative standard error of 0.1 / sqrt(3): log-ratio half width t(4) * 0.1 * sqrt(2/3)
    half = 2.7764451 * 0.1 * (2 / 3) ** 0.5
    assert (interval.low, interval.high) == pytest.approx((2.0 * math.exp(-half), 2.0 * math.exp(half)), rel=1e-6)
    assert interval.low < row.speedup.mean < interval.high
