"""The report's figures (matplotlib, Agg, no pyplot state): speedup, accuracy against time, time split."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from firescale.atomic import atomic_path
from firescale.report.summary import Row, Summary

_UNITS = ((2 * 86400, 86400.0, "days"), (2 * 3600, 3600.0, "h"), (120, 60.0, "min"), (0, 1.0, "s"))


def _figure(width: float = 6.4, height: float = 4.2) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save_figure(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    """Write `fig` as STEM.png and STEM.pdf, each atomically; without dates, so reruns are comparable."""
    written = []
    for ext, meta in (("png", {"Software": "firescale report (matplotlib)"}), ("pdf", {"CreationDate": None})):
        path = out_dir / f"{stem}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=150, metadata=meta)
        written.append(path)
    return written


def _empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def point_colours(groups: list[str]) -> dict[str, tuple[float, float, float]]:
    """A colour per point (a group of repeats), in the order given: tab10's, then tab20's beyond ten."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(groups) <= 10 else "tab20"]
    out = {}
    for i, group in enumerate(groups):
        r, g, b, _ = cmap(i % cmap.N)
        out[group] = (r, g, b)
    return out


def shade(colour: tuple[float, float, float], k: int, n: int) -> tuple[float, float, float]:
    """The k-th of n repeats' shades of `colour`: the first the colour itself, the last mixed half with white (its
    hue unchanged)."""
    f = 0.55 * k / (n - 1) if n > 1 else 0.0
    r, g, b = (c + (1.0 - c) * f for c in colour)
    return (r, g, b)


def _speedup_lines(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """A line per batch (per batch and rate where a batch searched rates), each from the 1-GPU baseline unless the
    batch has its own 1-GPU point, through its points in order of GPUs."""
    base = next((r for r in rows if r.baseline), None)
    points = [r for r in rows if not r.baseline]
    rates = {b: {r.lr for r in points if r.batch == b} for b in {r.batch for r in points}}
    series = sorted({(r.batch, r.lr if len(rates[r.batch]) > 1 else None) for r in points},
                    key=lambda k: (k[0], k[1] or 0.0))
    out = []
    for batch, lr in series:
        line = sorted((r for r in points if r.batch == batch and (lr is None or r.lr == lr)), key=lambda r: r.gpus)
        if base is not None and line[0].gpus > 1:
            line = [base, *line]
        out.append((f"batch {batch}" + (f", LR {lr:g}" if lr is not None else ""), line))
    return out


def speedup_figure(summary: Summary, title: str) -> Any:
    """Measured speedup (mean ± std over repeats) against GPUs, one line per batch size from the baseline, and the
    ideal; the GPU axis is ticked at the measured GPU counts only."""
    from matplotlib.ticker import NullLocator

    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title(f"Speedup: {title}")
    if summary.baseline is None:
        _empty(ax, "Speedup cannot be computed: " + (summary.baseline_note or "no baseline."))
        return fig
    rows = [r for r in summary.rows if r.speedup is not None]
    top = max(r.gpus for r in rows)
    ax.plot([1, top], [1, top], linestyle="--", color="grey", label="ideal (linear)")
    for label, line in _speedup_lines(rows):
        speedups = [(r.gpus, r.speedup) for r in line if r.speedup is not None]
        ax.errorbar([g for g, _ in speedups], [s.mean for _, s in speedups], yerr=[s.std or 0.0 for _, s in speedups],
                    marker="o", capsize=3, label=label)
    base = summary.baseline   # at its own mean speedup, where the lines start: 1 but for the spread of its repeats
    ax.plot([base.gpus], [base.speedup.mean if base.speedup else 1.0], linestyle="none", marker="s", color="black",
            zorder=3, label=f"baseline ({base.gpus} GPU, batch {base.batch})")
    if top > 8:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
    gpus = sorted({r.gpus for r in rows})
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("GPUs")
    ax.set_ylabel("speedup over the 1-GPU baseline")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def accuracy_figure(summary: Summary, title: str) -> Any:
    """Top-1 against training wall time for every succeeded run, with the parity threshold: a colour per point,
    its repeats in shades of it, one legend entry per point."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title(f"Top-1 accuracy against wall time: {title}")
    runs = [(r, m) for r in summary.rows for m in r.runs]
    if not runs:
        _empty(ax, "No run succeeded.")
        return fig
    longest = max((e.wall_s for _, m in runs for e in m.evals), default=0.0)
    div, unit = next((d, u) for limit, d, u in _UNITS if longest >= limit)
    colours = point_colours([r.group for r in summary.rows])
    for row in summary.rows:
        n = len(row.runs)
        for k, m in enumerate(row.runs):
            label = (row.group + (f" ({n} repeats, in shades)" if n > 1 else "")) if k == 0 else "_nolegend_"
            ax.plot([e.wall_s / div for e in m.evals], [e.top1 * 100 for e in m.evals], marker=".",
                    linewidth=2.0 if row.baseline else 1.2, color=shade(colours[row.group], k, n), label=label,
                    gid=m.point)
    if summary.baseline is not None:
        threshold = (summary.baseline.top1.mean - summary.tolerance) * 100
        ax.axhline(threshold, color="grey", linestyle="--", label=f"parity threshold {threshold:.1f}%")
    if summary.target_accuracy is not None:
        ax.axhline(summary.target_accuracy * 100, color="black", linestyle=":", label="fixed target")
    ax.set_xlabel(f"training wall time ({unit}, queue excluded)")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def time_split_figure(summary: Summary, title: str) -> Any:
    """Stacked mean time per iteration: data wait, compute, allreduce, one bar per point."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title(f"Time per iteration: {title}")
    if not summary.rows:
        _empty(ax, "No run succeeded.")
        return fig
    names = [r.group for r in summary.rows]
    bottom = [0.0] * len(names)
    for attr, label in (("data_wait_s", "data wait"), ("compute_s", "compute"), ("allreduce_s", "allreduce")):
        values = [getattr(r, attr).mean * 1e3 for r in summary.rows]
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("ms per iteration (mean over repeats)")
    ax.set_xlabel("point")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def write_plots(summary: Summary, out_dir: str | Path, title: str) -> list[Path]:
    """speedup, accuracy_vs_time and time_split, each as PNG and PDF in `out_dir`."""
    out_dir = Path(out_dir)
    written = []
    for stem, make in (("speedup", speedup_figure), ("accuracy_vs_time", accuracy_figure),
                       ("time_split", time_split_figure)):
        written += save_figure(make(summary, title), out_dir, stem)
    return written
