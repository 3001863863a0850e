"""`firescale results compare A B`: two selections of stored runs point by point, with verdicts."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from firescale.commands.results_add import STORE_HELP

if TYPE_CHECKING:
    from firescale.report.comparison import Comparison, Difference, PointComparison
    from firescale.store.runs import StoredRun

REGRESSION_EXIT = 3
SELECTION_HELP = ("runs chosen by key=value pairs joined by commas: site, experiment, commit (a prefix), tag, "
                  "framework, precision, since, until (dates), sweep")
HEADS = (("point", 16), ("n A/B", 6), ("iter A", 10), ("iter B", 10), ("B - A (95% CI)", 32), ("change", 8),
         ("train time A/B", 18), ("speedup A/B", 13), ("top-1 A/B", 13), ("verdict", 0))
_RIGHT = (1, 2, 3, 5)   # the columns of one number each


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="the reference runs (before): " + SELECTION_HELP)
    parser.add_argument("b", metavar="B", help="the candidate runs (after), selected as A is")
    parser.add_argument("--store", metavar="URL",
                        help=STORE_HELP + "; without it each side reads the store of the site it names")
    parser.add_argument("--json", type=Path, metavar="F", help="write the comparison to F as JSON")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help=f"exit with status {REGRESSION_EXIT} when any point's iteration is slower in B beyond "
                             f"its 95%% interval")


def _side(text: str, side: str, given: str | None) -> list[StoredRun]:
    from firescale.store.compare import selected
    from firescale.store.select import Selection
    from firescale.store.sites import open_site_store

    selection = Selection.parse(text, f"selection {side}")
    store = open_site_store(given, selection.value("site"))
    try:
        return selected(store, selection, side)
    finally:
        store.close()


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _signed_ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.2f}"


def _interval(d: Difference | None) -> str:
    if d is None:
        return "-"
    if d.interval is None:
        return f"{_signed_ms(d.value)} ms"
    return f"{_signed_ms(d.value)} [{_signed_ms(d.interval.low)}, {_signed_ms(d.interval.high)}] ms"


def _pair(a: float | None, b: float | None, form: str) -> str:
    return " / ".join("-" if v is None else form.format(v) for v in (a, b))


def _line(p: PointComparison) -> str:
    pct = p.iteration_pct
    cells = (p.point, f"{p.a.n}/{p.b.n}", _ms(p.a.mean("iteration_s")), _ms(p.b.mean("iteration_s")),
             _interval(p.diff("iteration_s")), "-" if pct is None else f"{pct:+.1f}%",
             _pair(p.a.mean("train_time_s"), p.b.mean("train_time_s"), "{:.1f} s"),
             _pair(p.a.mean("speedup"), p.b.mean("speedup"), "{:.2f}x"),
             _pair(p.a.mean("top1"), p.b.mean("top1"), "{:.1%}"), p.verdict)
    return _row(cells)


def _row(cells: tuple[str, ...]) -> str:
    out = [text.rjust(width) if i in _RIGHT else text.ljust(width)
           for i, ((_, width), text) in enumerate(zip(HEADS, cells))]
    return "  ".join(out).rstrip()


def summary_line(comparison: Comparison, a_runs: int, b_runs: int) -> str:
    counts = ", ".join(f"{n} {verdict}" for verdict, n in comparison.counts().items())
    failed = [f"{side} failed: {', '.join(names)}" for side, names in (("A", comparison.a_failed),
                                                                       ("B", comparison.b_failed)) if names]
    tail = f"; {'; '.join(failed)}" if failed else ""
    return (f"A {comparison.a_label} ({a_runs} runs) against B {comparison.b_label} ({b_runs} runs): "
            f"{len(comparison.points)} points, {counts}{tail}")


def run(args: argparse.Namespace) -> int:
    from firescale.atomic import atomic_write_json
    from firescale.store.compare import compare_selections

    a_runs, b_runs = _side(args.a, "A", args.store), _side(args.b, "B", args.store)
    comparison = compare_selections(a_runs, b_runs, a_label=args.a, b_label=args.b)
    print(_row(tuple(head for head, _ in HEADS)))
    for point in comparison.points:
        print(_line(point))
    print(summary_line(comparison, len(a_runs), len(b_runs)))
    if args.json:
        atomic_write_json(args.json, comparison.to_dict())
        print(f"wrote {args.json}")
    if comparison.regression:
        slower = ", ".join(f"{p.point} ({p.iteration_pct:+.1f}%)" for p in comparison.slower
                           if p.iteration_pct is not None)
        print(f"regression: slower in B beyond the 95% interval: {slower}")
        if args.fail_on_regression:
            return REGRESSION_EXIT
    return 0
