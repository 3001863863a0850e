"""The report's figures read back from their matplotlib objects: the speedup's GPU ticks and joined lines, a colour
per point with its repeats in shades, and every figure written shown in the Markdown and the HTML."""
from __future__ import annotations

import colorsys
import copy

import pytest
from report_records import raw_record

from firescale.report.formatting import ReportContext
from firescale.report.html import to_html
from firescale.report.memory_plots import accuracy_by_batch_figure
from firescale.report.plots import accuracy_figure, speedup_figure
from firescale.report.summary import summarize
from firescale.report.tables import figures, to_markdown
from firescale.sweep.records import run_record_from_dict

TOL = 0.02


def _at(source: str, gpus: int, batch: int, repeat: int = 0, speed: float = 1.0):
    """The fixture record `source` as the point g{gpus}-b{batch}-r{repeat}, its times divided by `speed`."""
    data = copy.deepcopy(raw_record(source))
    data.update(point=f"g{gpus}-b{batch}-r{repeat}", gpus=gpus, nodes=1, batch=batch, repeat=repeat)
    data["train"]["train_time_s"] /= speed
    for e in data["train"]["evals"]:
        e["wall_s"] /= speed
    return run_record_from_dict(data, data["point"])


def _lines(fig):
    """The speedup figure's lines, label -> (GPUs, speedups), from its error-bar containers."""
    ax = fig.axes[0]
    return {c.get_label(): (list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())) for c in ax.containers}


def test_the_gpu_axis_is_ticked_at_the_measured_counts_and_each_batch_is_a_line_from_the_baseline(records):
    fig = speedup_figure(summarize(records, TOL), "t")
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1, 2]                  # not 1.0, 1.2, 1.4 ...
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    assert list(ax.xaxis.get_minorticklocs()) == []
    # batch 256 has one point (2 GPUs): its line starts at the baseline, so it is a line and not a lone dot
    assert _lines(fig) == {"batch 64": ([1, 2], [1.0, pytest.approx((100 / 60 + 100 / 80) / 2)]),
                           "batch 256": ([1, 2], [1.0, pytest.approx(100 / 70)])}


def test_a_batch_with_its_own_one_gpu_point_starts_there_and_a_wide_sweep_is_ticked_in_powers_of_two(records):
    base = next(r for r in records if r.baseline)
    sweep = [base, _at("g2-b256-r0", 1, 256, speed=1.1), _at("g2-b256-r0", 8, 256, speed=5.0),
             _at("g2-b64-r0", 64, 64, speed=30.0)]
    fig = speedup_figure(summarize(sweep, TOL), "t")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [1, 8, 64]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8", "64"]
    lines = _lines(fig)
    assert lines["batch 64"][0] == [1, 64]          # from the baseline (batch 64 has no 1-GPU point of its own)
    assert lines["batch 256"][0] == [1, 8] and lines["batch 256"][1][0] == pytest.approx(100 / (70 / 1.1))


def _hsv(line):
    return colorsys.rgb_to_hsv(*line.get_color()[:3])


def test_each_point_has_one_colour_and_its_repeats_are_shades_of_it(records):
    ax = accuracy_figure(summarize(records, TOL), "t").axes[0]
    runs = {line.get_gid(): line for line in ax.lines if line.get_gid()}
    assert sorted(runs) == ["baseline", "g2-b256-r0", "g2-b64-r0", "g2-b64-r1"]
    r0, r1 = _hsv(runs["g2-b64-r0"]), _hsv(runs["g2-b64-r1"])
    assert r0[0] == pytest.approx(r1[0], abs=1e-6)        # the same hue
    assert r0[1] > r1[1] + 0.2                            # the second repeat is a paler shade of it
    hues = [_hsv(runs[p])[0] for p in ("baseline", "g2-b64-r0", "g2-b256-r0")]
    assert min(abs(a - b) for i, a in enumerate(hues) for b in hues[i + 1:]) > 0.05   # three points, three hues
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["baseline", "g2-b64 (2 repeats, in shades)", "g2-b256", "parity threshold 93.0%"]


def test_the_accuracy_by_batch_figure_colours_each_point_as_the_accuracy_figure_does(records):
    summary = summarize(records, TOL)
    by_time = {l.get_gid(): l.get_color() for l in accuracy_figure(summary, "t").axes[0].lines if l.get_gid()}
    ordered = sorted((r for r in records if r.train), key=lambda r: (not r.baseline, r.gpus, r.batch, r.repeat))
    ax = accuracy_by_batch_figure([(r.point, r.train) for r in ordered], "t").axes[0]
    by_batch = {l.get_gid(): l.get_color() for l in ax.lines if l.get_gid()}
    assert by_batch == by_time
    assert len(ax.get_legend().get_texts()) == 3          # a legend line per point, not per run


def test_the_report_shows_exactly_the_figures_written(records, ctx):
    summary = summarize(records, TOL)
    md, html = to_markdown(summary, ctx, []), to_html(summary, ctx, [])
    assert list(figures(ctx)) == ["speedup", "accuracy_vs_time", "time_split"]
    assert "memory.png" not in md and "accuracy_by_batch.png" not in html      # not written: not shown
    beside = ReportContext(**{**ctx.__dict__, "figures_beside": ("memory", "accuracy_by_batch")})
    md, html = to_markdown(summary, beside, []), to_html(summary, beside, [])
    for stem in ("speedup", "accuracy_vs_time", "time_split", "accuracy_by_batch", "memory"):
        assert f"]({stem}.png)" in md and f'<img src="{stem}.png"' in html, stem
