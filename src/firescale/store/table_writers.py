"""The cross-site table as Markdown, LaTeX, HTML and CSV, written atomically (table.md last)."""
from __future__ import annotations

import csv
import io
import re
from html import escape
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_text
from firescale.report import formatting as cells
from firescale.report.html import CSS, _verdict_class
from firescale.report.summary import Stat
from firescale.report.tables import _md_cell, _tex_comment, tex_escape
from firescale.store.table import FAILED, PUBLISHED, CrossSiteTable, TableRow

HEADS = ["Hardware", "Site", "Framework", "Net", "Epochs", "Batch", "Initial LR", "Train time", "Speedup",
         "Top-1", "Top-5", "Parity", "Source"]
DASH = cells.DASH
TABLE_CSS = CSS + """
table.across { font-size: 0.85em; }
table.across th, table.across td { padding: 0.3em 0.45em; }
div.scroll { overflow-x: auto; }
caption { caption-side: top; text-align: left; padding-bottom: 0.5em; max-width: 1100px; }
tr.published td { background: #f3f6fa; color: #37474f; font-style: italic; }
tr.published.first td { border-top: 1px solid #222; }
th.num { text-align: right; }
td.nowrap, th { white-space: nowrap; }
td.hardware { min-width: 11em; }
td.parity { min-width: 9em; }
tr.site-first td { border-top: 1px solid #999; }
"""
# The page's classes of some columns' cells (numbers are "num").
_CLASSES = {"Site": "nowrap", "Framework": "nowrap", "Net": "nowrap", "Hardware": "hardware", "Source": "nowrap"}


def _or_dash(value: Stat | None, shown: Any) -> str:
    return DASH if value is None else shown(value)


def _printed_speedup(stat: Stat | None) -> str:
    return DASH if stat is None else f"{stat.mean:g}×"


def sources(table: CrossSiteTable) -> dict[str, int]:
    """The published rows' sources, each numbered once in the order they first appear: 'published [1]'."""
    found = dict.fromkeys(r.source for r in table.rows if r.kind == PUBLISHED)
    return {source: i for i, source in enumerate(found, 1)}


def notes(table: CrossSiteTable) -> list[str]:
    """The table's notes, then its numbered sources."""
    return [*table.notes, *(f"[{i}] {source}." for source, i in sources(table).items())]


def row_cells(row: TableRow, marks: dict[str, int] | None = None) -> list[str]:
    """A row's cells as plain Unicode text, for every format; a published row's source as its number in
    `marks` where given (see `sources`)."""
    stack = ", ".join(x for x in (row.framework, row.precision) if x) or DASH
    failed = row.kind == FAILED
    speedup = _printed_speedup(row.speedup) if row.kind == PUBLISHED else cells.speedup(row.speedup)
    return [row.hardware, row.site or DASH, stack, row.net or DASH, _or_dash(row.epochs, cells.epochs),
            row.batch or DASH, DASH if row.lr is None else f"{row.lr:g}",
            "FAILED" if failed else _or_dash(row.time_s, cells.duration), speedup,
            _or_dash(row.top1, cells.percent), _or_dash(row.top5, cells.percent), row.verdict or DASH,
            row.source if row.kind != PUBLISHED else f"published [{marks[row.source]}]" if marks else
            f"published: {row.source}"]


def rule_before(rows: list[TableRow], i: int) -> bool:
    """Whether row `i` starts a group, a site's measured rows or the published ones, after another group."""
    if i == 0:
        return False
    before, row = rows[i - 1], rows[i]
    if (before.kind == PUBLISHED) != (row.kind == PUBLISHED):
        return True
    return row.kind != PUBLISHED and before.site != row.site


def title(table: CrossSiteTable) -> str:
    return f"{table.experiment} across sites"


def to_markdown(table: CrossSiteTable) -> str:
    out = [f"# {title(table)}", "", table.caption, "", "| " + " | ".join(HEADS) + " |",
           "|" + "|".join("---:" if h in cells.NUMERIC else "---" for h in HEADS) + "|"]
    marks = sources(table)
    out += ["| " + " | ".join(_md_cell(c) for c in row_cells(r, marks)) + " |" for r in table.rows]
    return "\n".join(out + [""] + [f"- {n}" for n in notes(table)] + [""])


def to_latex(table: CrossSiteTable) -> str:
    """A booktabs table ready to \\input, published rows after a rule."""
    spec = "".join("r" if h in cells.NUMERIC else "l" for h in HEADS)
    label = re.sub(r"[^A-Za-z0-9-]", "-", f"{table.experiment}-across-sites")
    lines = [_tex_comment(f"firescale results table: {title(table)}"), "% Needs \\usepackage{booktabs}.",
             r"\begin{table}[htbp]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
             rf"\caption{{{tex_escape(table.caption)}}}", rf"\label{{tab:{label}}}",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(tex_escape(h) for h in HEADS) + r" \\",
             r"\midrule"]
    marks = sources(table)
    for i, row in enumerate(table.rows):
        if rule_before(table.rows, i):
            lines.append(r"\midrule")
        lines.append(" & ".join(tex_escape(c) for c in row_cells(row, marks)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize",
              *(tex_escape(n) + r"\par" for n in notes(table)), r"\end{minipage}", r"\end{table}", ""]
    return "\n".join(lines)


def _html_row(row: TableRow, first: bool, marks: dict[str, int]) -> str:
    """A row of the page; `first`: the first of its site or of the published rows, with a rule above it."""
    tds = []
    for head, text in zip(HEADS, row_cells(row, marks), strict=True):
        cls = _CLASSES.get(head, "num" if head in cells.NUMERIC else "")
        if head == "Parity":
            cls = f"{_verdict_class(text)} parity".strip()
        tds.append(f'<td class="{cls}">{escape(text)}</td>' if cls else f"<td>{escape(text)}</td>")
    kind = {PUBLISHED: "published first" if first else "published", FAILED: "failed"}.get(row.kind, "")
    if first and row.kind != PUBLISHED:
        kind = f"{kind} site-first".strip()
    return (f'<tr class="{kind}">' if kind else "<tr>") + "".join(tds) + "</tr>"


def to_html(table: CrossSiteTable) -> str:
    """A complete, self-contained page; every text escaped."""
    h = escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{h(title(table))}</title>", f"<style>{TABLE_CSS}</style>", "</head>", "<body>",
           f"<h1>{h(title(table))}</h1>", '<div class="scroll">', '<table class="across">',
           f"<caption>{h(table.caption)}</caption>",
           "<thead><tr>" + "".join(f'<th class="num">{h(x)}</th>' if x in cells.NUMERIC else f"<th>{h(x)}</th>"
                                   for x in HEADS) + "</tr></thead>", "<tbody>"]
    marks = sources(table)
    for i, row in enumerate(table.rows):
        out.append(_html_row(row, rule_before(table.rows, i), marks))
    out += ["</tbody>", "</table>", "</div>", "<ul>", *(f"<li>{h(n)}</li>" for n in notes(table)), "</ul>",
            "</body>", "</html>", ""]
    return "\n".join(out)


CSV_FIELDS = ["kind", "site", "hardware", "device", "gpus", "nodes", "framework", "precision", "net", "batch", "lr",
              "repeats", "epochs_mean", "epochs_std", "time_s_mean", "time_s_std", "speedup_mean", "speedup_std",
              "speedup_against", "top1_mean", "top1_std", "top5_mean", "top5_std", "parity", "sweep", "commit",
              "source"]


def _csv_row(row: TableRow) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": row.kind, "site": row.site, "hardware": row.hardware, "device": row.device,
                           "gpus": row.gpus, "nodes": row.nodes, "framework": row.framework,
                           "precision": row.precision, "net": row.net, "batch": row.batch, "lr": row.lr,
                           "repeats": row.repeats, "speedup_against": row.against, "parity": row.verdict,
                           "sweep": row.sweep, "commit": row.commit, "source": row.source}
    for name in ("epochs", "time_s", "speedup", "top1", "top5"):
        stat = getattr(row, name)
        out[f"{name}_mean"] = "" if stat is None else stat.mean
        out[f"{name}_std"] = "" if stat is None or stat.std is None else stat.std
    return {k: ("" if v is None else v) for k, v in out.items()}


def to_csv(table: CrossSiteTable) -> str:
    """One line per row with raw numbers: seconds, fractions, speedups as ratios."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(_csv_row(r) for r in table.rows)
    return buffer.getvalue()


def write_table(table: CrossSiteTable, folder: Path) -> list[Path]:
    """table.csv, .tex, .html, then table.md (last: its presence means the rest is there) into `folder`."""
    writers = (("csv", to_csv), ("tex", to_latex), ("html", to_html), ("md", to_markdown))
    return [atomic_write_text(folder / f"table.{ext}", write(table)) for ext, write in writers]
