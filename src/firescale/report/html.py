"""The report as one self-contained HTML page: inline CSS, figures by relative path."""
from __future__ import annotations

from html import escape

from firescale.report import formatting as cells
from firescale.report.formatting import ReportContext
from firescale.report.sections import Section, detail_section, sections
from firescale.report.summary import Summary
from firescale.report.tables import figures, title

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1400px;
       color: #222; line-height: 1.4; padding: 0 1em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
thead th { border-top: 2px solid #222; border-bottom: 1px solid #222; }
tbody tr:last-child td { border-bottom: 2px solid #222; }
th, td { padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { background: #fdecea; }
tr.chosen td { background: #e8f5e9; font-weight: 600; }
.matches { color: #1b5e20; font-weight: 600; }
.below, .failed-word { color: #b71c1c; font-weight: 600; }
.note-baseline { border-left: 4px solid #b71c1c; padding: 0.5em 1em; background: #fdecea; }
figure { display: inline-block; margin: 1em; max-width: 45%; }
figure img { max-width: 100%; }
pre { background: #f5f5f5; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
"""

def _verdict_class(text: str) -> str:
    if text == "MATCHES":
        return "matches"
    if text.startswith("BELOW"):
        return "below"
    if text.startswith(("FAILED", "MISSING")):
        return "failed-word"
    return ""


def _section(section: Section) -> list[str]:
    """A table after the main one: its title, the sentences before it, its rows (the chosen one marked), its notes."""
    h = escape
    out = [f"<h2>{h(section.title)}</h2>", *(f"<p>{h(text)}</p>" for text in section.intro)]
    if section.rows:
        out += ["<table>", "<thead><tr>" + "".join(f"<th>{h(x)}</th>" for x in section.heads) + "</tr></thead>",
                "<tbody>"]
        marked = section.marked or [False] * len(section.rows)
        for row, m in zip(section.rows, marked):
            tds = "".join(f'<td class="num">{h(c)}</td>' if head in cells.NUMERIC else f"<td>{h(c)}</td>"
                          for head, c in zip(section.heads, row))
            out.append(('<tr class="chosen">' if m else "<tr>") + tds + "</tr>")
        out += ["</tbody>", "</table>"]
    return out + ["<ul>"] + [f"<li>{h(n)}</li>" for n in section.notes] + ["</ul>"]


def to_html(summary: Summary, ctx: ReportContext, provenance_lines: list[str]) -> str:
    """The whole report as HTML; every text is escaped."""
    heads, body, failed = cells.table(summary, ctx)
    h = escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{h(title(ctx))}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
           f"<h1>{h(title(ctx))}</h1>"]
    if ctx.description:
        out.append(f"<p>{h(ctx.description)}</p>")
    if summary.baseline_note:
        out.append(f'<p class="note-baseline">{h(summary.baseline_note)}</p>')
    out += ["<table>", "<thead><tr>" + "".join(f"<th>{h(x)}</th>" for x in heads) + "</tr></thead>", "<tbody>"]
    for row, is_failure in zip(body, failed):
        tds = []
        for head, text in zip(heads, row):
            cls = "num" if head in cells.NUMERIC else _verdict_class(text) if head in ("Parity", "Train time") else ""
            tds.append(f'<td class="{cls}">{h(text)}</td>' if cls else f"<td>{h(text)}</td>")
        out.append(('<tr class="failed">' if is_failure else "<tr>") + "".join(tds) + "</tr>")
    out += ["</tbody>", "</table>", "<ul>"] + [f"<li>{h(n)}</li>" for n in cells.notes(summary, ctx)] + ["</ul>"]
    for section in [detail_section(summary), *sections(summary, ctx)]:
        out += _section(section)
    if summary.failures:
        out.append("<h2>Failed points</h2>")
        for record in summary.failures:
            out += [f"<h3>{h(record.point)}: {h(cells.failure_word(record))}</h3>", "<ul>",
                    f"<li>reason: {h(record.reason or 'none recorded')}</li>",
                    f"<li>scheduler: {h(' → '.join(record.scheduler_states) or 'no submission recorded')}</li>"]
            if record.exit_code is not None:
                out.append(f"<li>exit code: {h(str(record.exit_code))}</li>")
            out += [f"<li>record: <code>{h(record.source)}</code></li>", "</ul>"]
            if record.log_tail:
                out.append(f"<details><summary>tail of the job log</summary><pre>{h(record.log_tail)}</pre></details>")
    out.append("<h2>Figures</h2>")
    for stem, caption in figures(ctx).items():
        out.append(f'<figure><img src="{h(stem)}.png" alt="{h(caption)}"><figcaption>{h(caption)} '
                   f'(<a href="{h(stem)}.pdf">PDF</a>)</figcaption></figure>')
    out += ["<h2>Provenance</h2>", "<ul>"] + [f"<li>{h(line)}</li>" for line in provenance_lines]
    out += ["</ul>", "</body>", "</html>", ""]
    return "\n".join(out)
