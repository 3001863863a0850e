"""Write every output of the report into one folder, each file atomically, report.md last."""
from __future__ import annotations

from pathlib import Path

from firescale.atomic import atomic_write_json, atomic_write_text
from firescale.report.formatting import ReportContext
from firescale.report.html import to_html
from firescale.report.plots import write_plots
from firescale.report.provenance import provenance_lines
from firescale.report.summary import Summary
from firescale.report.tables import to_csv, to_json, to_latex, to_markdown

OUTPUTS = ("report.md", "report.tex", "report.html", "report.csv", "report.json",
           "speedup.png", "speedup.pdf", "accuracy_vs_time.png", "accuracy_vs_time.pdf",
           "time_split.png", "time_split.pdf",
           # written by `firescale report` beside these (report.memory_plots)
           "memory.png", "memory.pdf", "accuracy_by_batch.png", "accuracy_by_batch.pdf")


def write_report(summary: Summary, ctx: ReportContext, out_dir: str | Path) -> list[Path]:
    """Plots, LaTeX, HTML, CSV, JSON, then report.md (the file workflows wait for); returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = provenance_lines(ctx.provenance) if ctx.provenance else []
    written = write_plots(summary, out_dir, f"{ctx.experiment} on {ctx.site}")
    written.append(atomic_write_text(out_dir / "report.tex", to_latex(summary, ctx, lines)))
    written.append(atomic_write_text(out_dir / "report.html", to_html(summary, ctx, lines)))
    written.append(atomic_write_text(out_dir / "report.csv", to_csv(summary, ctx)))
    written.append(atomic_write_json(out_dir / "report.json", to_json(summary, ctx)))
    written.append(atomic_write_text(out_dir / "report.md", to_markdown(summary, ctx, lines)))
    return written
