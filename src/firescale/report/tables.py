"""The report as Markdown, LaTeX (booktabs), CSV and JSON; the HTML lives in html.py."""
from __future__ import annotations

import csv
import io
import re
from typing import Any

from firescale.report import formatting as cells
from firescale.report.formatting import ReportContext
from firescale.report.sections import Section, detail_section, sections
from firescale.report.summary import PREDICTED_PARTS, Row, Summary, stat_dict
from firescale.sweep.records import RunRecord

REPORT_FORMAT = "firescale.report/1"
PLOTS = {
    "speedup": "Speedup against GPUs, a line per batch from the 1-GPU baseline, with the ideal (linear) line.",
    "accuracy_vs_time": "Top-1 accuracy against training wall time, every run: a colour per point, its repeats "
                        "in shades of it.",
    "time_split": "Where an iteration's time goes: data wait, compute, allreduce.",
}
# Written by `firescale report` beside these (report.memory_plots) and shown with them: ReportContext.figures_beside.
BESIDE = {
    "accuracy_by_batch": "Top-1 accuracy against iterations, a line per batch phase of each run "
                         "(a batch schedule continues its line with another marker).",
    "memory": "Memory per layer of the net at the baseline's batch per device: allocated in forward, backward and "
              "update, their running total, the peak in use and the device's memory.",
}
TABLES = {"report.md": "The report (Markdown)", "report.tex": "The tables for a paper (LaTeX, booktabs)",
          "report.html": "The report (HTML)", "report.csv": "The table's numbers (CSV)",
          "report.json": "Everything in the report (JSON)"}


def figures(ctx: ReportContext) -> dict[str, str]:
    """The figures the report shows, stem -> caption: its own and every one written beside them."""
    return {**PLOTS, **{stem: BESIDE[stem] for stem in BESIDE if stem in ctx.figures_beside}}


def title(ctx: ReportContext) -> str:
    return f"Reproducibility report: {ctx.experiment} on {ctx.site}"


def caption(ctx: ReportContext) -> str:
    about = f" {ctx.description.rstrip('.')}." if ctx.description else ""
    return f"{ctx.experiment} on {ctx.site}: speed and accuracy against the single-GPU baseline.{about}"


# ------------------------------------------------------------------------------------- Markdown

def _md_cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _md_table(heads: list[str], rows: list[list[str]]) -> list[str]:
    align = ["---:" if h in cells.NUMERIC else "---" for h in heads]
    return ["| " + " | ".join(heads) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows)]


def _md_section(section: Section) -> list[str]:
    out = [f"## {section.title}", ""] + [line for text in section.intro for line in (text, "")]
    if section.rows:
        out += _md_table(section.heads, section.rows) + [""]
    return out + [f"- {n}" for n in section.notes] + [""]


def to_markdown(summary: Summary, ctx: ReportContext, provenance_lines: list[str]) -> str:
    """The whole report in GitHub-flavoured Markdown, figures by relative path."""
    heads, body, _ = cells.table(summary, ctx)
    out = [f"# {title(ctx)}", ""]
    if ctx.description:
        out += [ctx.description, ""]
    if summary.baseline_note:
        out += [f"**{summary.baseline_note}**", ""]
    out += _md_table(heads, body)
    out += [""] + [f"- {n}" for n in cells.notes(summary, ctx)] + [""]
    for section in [detail_section(summary), *sections(summary, ctx)]:
        out += _md_section(section)
    if summary.failures:
        out += ["## Failed points", ""]
        for record in summary.failures:
            out += [f"### {record.point}: {cells.failure_word(record)}", "",
                    f"- reason: {record.reason or 'none recorded'}"]
            out += [f"- scheduler: {' → '.join(record.scheduler_states) or 'no submission recorded'}"]
            if record.exit_code is not None:
                out += [f"- exit code: {record.exit_code}"]
            out += [f"- record: `{record.source}`", ""]
            if record.log_tail:
                fence = _fence(record.log_tail)
                out += ["<details><summary>tail of the job log</summary>", "", fence,
                        record.log_tail.rstrip("\n"), fence, "", "</details>", ""]
    out += ["## Figures", ""]
    for stem, caption in figures(ctx).items():
        out += [f"![{caption}]({stem}.png)", "", f"*{caption}* ([PDF]({stem}.pdf))", ""]
    out += ["## Provenance", ""] + [f"- {line}" for line in provenance_lines] + [""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- LaTeX

_TEX = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}",
    ">": r"\textgreater{}", "±": r"$\pm$", "×": r"$\times$", "†": r"$^{\dagger}$", "Δ": r"$\Delta$",
    "→": r"$\rightarrow$", "—": "---", "−": "$-$", "≥": r"$\geq$", "\n": " ",
}


def tex_escape(text: str) -> str:
    """Text made safe for LaTeX: its ten special characters and the report's symbols."""
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def _tex_comment(text: str) -> str:
    return "% " + " ".join(str(text).split())


def to_latex(summary: Summary, ctx: ReportContext, provenance_lines: list[str]) -> str:
    """A table environment (booktabs) ready to \\input into a paper; provenance as comments."""
    heads, body, failed = cells.table(summary, ctx, brief=True)
    spec = "".join("r" if h in cells.NUMERIC else "l" for h in heads)
    lines = [_tex_comment(f"firescale: {title(ctx)}"),
             "% Needs \\usepackage{booktabs} in the preamble.",
             *(_tex_comment(line) for line in provenance_lines),
             r"\begin{table}[htbp]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
             rf"\caption{{{tex_escape(caption(ctx))}}}",
             rf"\label{{tab:{re.sub(r'[^A-Za-z0-9-]', '-', f'{ctx.experiment}-{ctx.site}')}}}",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(tex_escape(h) for h in heads) + r" \\", r"\midrule"]
    for i, (row, is_failure) in enumerate(zip(body, failed)):
        if is_failure and (i == 0 or not failed[i - 1]):
            lines.append(r"\midrule")
        lines.append(" & ".join(tex_escape(c) for c in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\par\smallskip",
              r"\begin{minipage}{\linewidth}\footnotesize",
              *(tex_escape(n) + r"\par" for n in cells.notes(summary, ctx)),
              *(tex_escape(f"{f.point}: {cells.failure_text(f)}") + r"\par" for f in summary.failures),
              r"\end{minipage}", r"\end{table}", ""]
    for section in [detail_section(summary), *sections(summary, ctx)]:
        lines += _latex_section(section)
    return "\n".join(lines)


def _latex_section(section: Section) -> list[str]:
    """A section after the main table: its own booktabs table, its notes under it."""
    lines = [r"\begin{table}[htbp]", r"\centering", r"\small", rf"\caption{{{tex_escape(section.title)}}}"]
    if section.rows:
        spec = "".join("r" if h in cells.NUMERIC else "l" for h in section.heads)
        lines += [rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
                  " & ".join(tex_escape(h) for h in section.heads) + r" \\", r"\midrule",
                  *(" & ".join(tex_escape(c) for c in row) + r" \\" for row in section.rows),
                  r"\bottomrule", r"\end{tabular}"]
    lines += [r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize",
              *(tex_escape(n) + r"\par" for n in [*section.intro, *section.notes]), r"\end{minipage}",
              r"\end{table}", ""]
    return lines


# ------------------------------------------------------------------------------------ CSV, JSON

CSV_FIELDS = ["point", "kind", "repeats", "site", "device", "gpus", "nodes", "net", "batch", "lr",
              "epochs_mean", "epochs_std", "time_s_mean", "time_s_std", "tta_s_mean", "tta_s_std", "not_reached",
              "speedup_mean", "speedup_std", "speedup_ci_low", "speedup_ci_high", "efficiency_mean", "efficiency_std",
              "top1_mean", "top1_std", "top5_mean", "top5_std", "delta_top1_pts_mean", "delta_top1_pts_std",
              "delta_top1_ci_low", "delta_top1_ci_high", "parity", "data_wait_s", "compute_s", "allreduce_s",
              "iteration_s",
              "predicted_iteration_s", "iteration_error_pct", "predicted_time_s", "time_error_pct",
              *(f"predicted_{k}" for k in PREDICTED_PARTS), "reason", "scheduler_states"]


def _mean_std(out: dict[str, Any], name: str, stat: Any) -> None:
    out[f"{name}_mean"] = "" if stat is None else stat.mean
    out[f"{name}_std"] = "" if stat is None or stat.std is None else stat.std


def _csv_row(row: Row, ctx: ReportContext) -> dict[str, Any]:
    out: dict[str, Any] = {"point": row.group, "kind": "baseline" if row.baseline else "point",
                           "repeats": len(row.points), "site": ctx.site, "device": ctx.device, "gpus": row.gpus,
                           "nodes": row.nodes, "net": row.net, "batch": row.batch, "lr": row.lr,
                           "not_reached": row.not_reached}
    for name in ("epochs", "time_s", "tta_s", "speedup", "efficiency", "top1", "top5", "delta_top1_pts"):
        _mean_std(out, name, getattr(row, name))
    out["parity"] = "baseline" if row.baseline else (row.parity.verdict if row.parity else "")
    if row.speedup_interval is not None and not row.baseline:
        out.update(speedup_ci_low=row.speedup_interval.low, speedup_ci_high=row.speedup_interval.high)
    if row.parity is not None and row.parity.interval is not None:
        out.update(delta_top1_ci_low=row.parity.interval.low * 100.0,
                   delta_top1_ci_high=row.parity.interval.high * 100.0)
    for name in ("data_wait_s", "compute_s", "allreduce_s", "iteration_s"):
        out[name] = getattr(row, name).mean
    p = row.prediction
    if p is not None:
        out.update(predicted_iteration_s=p.iteration_s, iteration_error_pct=p.iteration_error_pct,
                   predicted_time_s=p.time_to_accuracy_s, time_error_pct=p.time_error_pct,
                   **{f"predicted_{k}": v for k, v in p.parts.items()})
    return out


def _csv_failure(record: RunRecord, ctx: ReportContext) -> dict[str, Any]:
    return {"point": record.point, "kind": record.outcome, "repeats": 1, "site": ctx.site, "device": ctx.device,
            "gpus": record.gpus, "nodes": record.nodes, "net": ctx.net, "batch": record.batch, "lr": record.lr,
            "parity": cells.failure_word(record), "reason": record.reason,
            "scheduler_states": " ".join(record.scheduler_states)}


def to_csv(summary: Summary, ctx: ReportContext) -> str:
    """One line per table row with raw numbers (seconds, fractions); failures carry their reason."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, restval="", lineterminator="\n")
    writer.writeheader()
    for row in summary.rows:
        writer.writerow(_csv_row(row, ctx))
    for record in summary.failures:
        writer.writerow(_csv_failure(record, ctx))
    return buffer.getvalue()


def _row_json(row: Row) -> dict[str, Any]:
    return {
        "group": row.group, "points": row.points, "baseline": row.baseline, "gpus": row.gpus, "nodes": row.nodes,
        "batch": row.batch, "lr": row.lr, "net": row.net, "repeats": len(row.points), "not_reached": row.not_reached,
        **{name: stat_dict(getattr(row, name)) for name in
           ("time_s", "tta_s", "tta_speedup", "epochs", "top1", "top5", "speedup", "efficiency", "delta_top1_pts",
            "data_wait_s", "compute_s", "allreduce_s", "iteration_s")},
        "parity": None if row.parity is None else {"verdict": row.parity.verdict, "matches": row.parity.matches,
                                                    "delta_pts": row.parity.delta_pts,
                                                    "interval_pts": _interval_json(row.parity.interval, 100.0)},
        "speedup_interval": None if row.baseline else _interval_json(row.speedup_interval),
        "hyperparameters": row.hyper,
        "prediction": None if row.prediction is None else {
            "iteration_s": row.prediction.iteration_s, "time_to_accuracy_s": row.prediction.time_to_accuracy_s,
            "iteration_error_pct": row.prediction.iteration_error_pct,
            "time_error_pct": row.prediction.time_error_pct, **row.prediction.parts},
        "runs": [{"point": m.point, "reached_target": m.reached_target, "time_s": m.time_s, "tta_s": m.tta_s,
                  "epochs": m.epochs, "epochs_to_target": m.epochs_to_target,
                  "top1": m.top1, "top5": m.top5, "iteration_s": m.iteration_s} for m in row.runs],
    }


def _interval_json(interval: Any, scale: float = 1.0) -> dict[str, float] | None:
    if interval is None:
        return None
    return {"low": interval.low * scale, "high": interval.high * scale, "level": interval.level, "df": interval.df}


def _failure_json(record: RunRecord) -> dict[str, Any]:
    return {"point": record.point, "outcome": record.outcome, "reason": record.reason, "gpus": record.gpus,
            "nodes": record.nodes, "batch": record.batch, "lr": record.lr, "repeat": record.repeat,
            "baseline": record.baseline, "scheduler_states": record.scheduler_states,
            "exit_code": record.exit_code, "log_tail": record.log_tail, "source": record.source}


def to_json(summary: Summary, ctx: ReportContext) -> dict[str, Any]:
    """Everything the report shows, as numbers, with the outputs and their captions."""
    out = {
        "format": REPORT_FORMAT, "experiment": ctx.experiment, "site": ctx.site, "device": ctx.device,
        "net": ctx.net, "description": ctx.description, "tolerance": summary.tolerance,
        "target_accuracy": summary.target_accuracy, "baseline_note": summary.baseline_note,
        "speedup_computed": summary.baseline is not None,
        "rows": [_row_json(r) for r in summary.rows], "failures": [_failure_json(f) for f in summary.failures],
        "notes": cells.notes(summary, ctx) + cells.detail_notes(summary),
        "sections": [x.to_dict() for x in sections(summary, ctx)],
        "predictions": summary.predictions_source or None,
        "calibration_gaps": summary.calibration_gaps,
        "predictions_calibrated": (not summary.uncalibrated) if summary.predictions_source else None,
        "calibration_misses": [{"point": r.group, "predicted_iteration_s": r.prediction.iteration_s,
                                "measured_iteration_s": r.iteration_s.mean,
                                "error_pct": r.prediction.iteration_error_pct}
                               for r in summary.calibration_misses if r.prediction is not None],
        "unmatched_predictions": summary.unmatched_predictions, "provenance": ctx.provenance,
        "outputs": {**TABLES, **{f"{stem}.{ext}": caption for stem, caption in figures(ctx).items()
                                for ext in ("png", "pdf")}},
    }
    if ctx.against_last is not None:
        out["against_last_sweep"] = ctx.against_last.to_dict()
    return out
