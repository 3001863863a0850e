"""The report's figures (matplotlib, Agg, no pyplot state): speedup, accuracy against time, time split."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from firescale.atomic import atomic_path
from firescale.report.summary import Summary

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


def speedup_figure(summary: Summary, title: str) -> Any:
    """Measured speedup (mean ± std over repeats) against GPUs, one line per batch size, and the ideal."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title(f"Speedup: {title}")
    if summary.baseline is None:
        _empty(ax, "Speedup cannot be computed: " + (summary.baseline_note or "no baseline."))
        return fig
    rows = [r for r in summary.rows if r.speedup is not None]
    top = max(r.gpus for r in rows)
    ax.plot([1, top], [1, top], linestyle="--", color="grey", label="ideal (linear)")
    rates = {b: {r.lr for r in rows if r.batch == b and not r.baseline} for b in {r.batch for r in rows}}
    series = sorted({(r.batch, r.lr if len(rates[r.batch]) > 1 else None) for r in rows if not r.baseline},
                    key=lambda k: (k[0], k[1] or 0.0))
    for batch, lr in series:   # one line per batch, or per batch and rate when a batch searched rates
        line = sorted((r for r in rows if r.batch == batch and (lr is None or r.lr == lr or r.baseline)),
                      key=lambda r: r.gpus)
        ax.errorbar([r.gpus for r in line], [r.speedup.mean for r in line],
                    yerr=[r.speedup.std or 0.0 for r in line], marker="o", capsize=3,
                    label=f"batch {batch}" + (f", LR {lr:g}" if lr is not None else ""))
    if top > 8:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("speedup over the 1-GPU baseline")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def accuracy_figure(summary: Summary, title: str) -> Any:
    """Top-1 against training wall time for every succeeded run, with the parity threshold."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title(f"Top-1 accuracy against wall time: {title}")
    runs = [(r, m) for r in summary.rows for m in r.runs]
    if not runs:
        _empty(ax, "No run succeeded.")
        return fig
    longest = max((e.wall_s for _, m in runs for e in m.evals), default=0.0)
    div, unit = next((d, u) for limit, d, u in _UNITS if longest >= limit)
    for row, m in runs:
        ax.plot([e.wall_s / div for e in m.evals], [e.top1 * 100 for e in m.evals], marker=".",
                linewidth=2.0 if row.baseline else 1.2, label=m.point)
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
