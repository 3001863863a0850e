"""`firescale report`: the reproducibility report of one experiment on one site (tables, plots, provenance)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from firescale.report.comparison import LastSweep
    from firescale.store.runs import RunContext, StoredRun
    from firescale.sweep.records import RunRecord


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="site name (site/<name>/site.yaml) or path to a site.yaml")
    parser.add_argument("--experiment", required=True, help="experiment name in the config")
    parser.add_argument("--results", required=True, help="folder with one <point>/result.json per sweep point")
    parser.add_argument("--out", required=True, help="folder to write report.md/.tex/.html/.csv/.json and plots")
    parser.add_argument("--config", help="experiments file (default: ./workflow/config.yaml)")
    parser.add_argument("--predictions", help="JSON from `firescale predict sweep --json`, shown beside measurements")
    parser.add_argument("--tolerance", type=float,
                        help="parity tolerance as a fraction (default: the experiment's target.tolerance)")
    parser.add_argument("--store", metavar="URL",
                        help="add the report's runs to this results store (a URL, a SQLite file's path, or 'site' "
                             "for the site's own store) and compare them with the last sweep it holds")


def _command_line(args: argparse.Namespace, config_path: Path) -> list[str]:
    """The command that makes this report again, from the parsed options (the config's path resolved)."""
    argv = ["firescale", "report", args.site, "--experiment", args.experiment, "--results", args.results,
            "--out", args.out, "--config", str(config_path)]
    if args.predictions:
        argv += ["--predictions", args.predictions]
    if args.tolerance is not None:
        argv += ["--tolerance", repr(args.tolerance)]
    if args.store:
        argv += ["--store", args.store]
    return argv


def _store_runs(records: list[RunRecord], context: RunContext) -> list[StoredRun]:
    """The report's succeeded and failed runs (not the placeholders of missing ones), as the store keeps them."""
    from firescale.atomic import load_json
    from firescale.store.runs import stored_run

    return [stored_run(load_json(r.source, "run record"), context, where=r.source)
            for r in records if r.outcome != "missing"]


def _against_last(url: str, site: str, experiment: str, found: list[StoredRun], source: str) -> LastSweep | None:
    """Add `found` to the store at `url`; this sweep against the last one before it there, if any."""
    from firescale.report.comparison import LastSweep
    from firescale.store.add import add_runs, group_sweeps
    from firescale.store.compare import compare_selections, last_sweep
    from firescale.store.database import open_store

    store = open_store(url, create=True)
    try:
        added = add_runs(store, found, source=source)
        key = next(iter(group_sweeps(found)), "")
        earlier = last_sweep(store, site, experiment, key) if key else None
    finally:
        store.close()
    said = (f"compared with the last sweep before it (commit {earlier.commit[:12]}, finished {earlier.finished_at})"
            if earlier else "no earlier sweep of another commit or versions to compare with")
    print(f"{store.name}: {added.added} runs added, {added.already} already there; {said}")
    if earlier is None:
        return None
    this = min(found, key=lambda r: (not r.baseline, r.gpus, r.batch, r.repeat))
    comparison = compare_selections(list(earlier.runs), found, a_label=f"sweep {earlier.key[:12]}",
                                    b_label=f"sweep {key[:12]}")
    return LastSweep(comparison, earlier.commit, earlier.finished_at, this.commit, earlier.differs)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from firescale.errors import FirescaleError
    from firescale.report.build import write_report
    from firescale.report.collect import RUN_FILE, collect_runs, missing_record
    from firescale.report.formatting import ReportContext
    from firescale.report.memory_plots import write_memory_and_batch_figures
    from firescale.report.provenance import collect_provenance
    from firescale.report.summary import (
        predicted_points,
        read_predictions,
        summarize,
        uncalibrated_predictions,
        unmeasured_in_calibration,
    )
    from firescale.sweep.net_file import net_file_digest
    from firescale.sweep.paths import config_file
    from firescale.sweep.plan import load_plan

    config_path = config_file(args.config)
    plan = load_plan(args.site, config_path, experiments=[args.experiment], check_limits=False)
    site, exp = plan.site, plan.experiment(args.experiment)
    tolerance = exp["target"]["tolerance"] if args.tolerance is None else args.tolerance
    if not 0 <= tolerance <= 1:
        raise FirescaleError(f"--tolerance {tolerance} is not a fraction between 0 and 1")

    results = Path(args.results)
    records = collect_runs(results, args.experiment)
    for record in records:
        if record.site and record.site != site.name:
            raise FirescaleError(f"{record.source}: key 'site' is {record.site!r}, but this report is for "
                                 f"site {site.name!r}")
    if site.name in exp["sites"]:
        # Points the sweep plans but that have no record still get a row that says so.
        have = {r.point for r in records}
        records += [missing_record(p, site.name, site.nodes_for(p.ranks, p.devices), results / p.name / RUN_FILE)
                    for p in plan.points[args.experiment] if p.name not in have]

    predicted = read_predictions(args.predictions) if args.predictions else None
    points = None if predicted is None else predicted_points(predicted, args.predictions)
    summary = summarize(records, tolerance, target_accuracy=exp["target"].get("accuracy"), predictions=points,
                        predictions_source=args.predictions or "",
                        calibration_gaps=None if predicted is None else unmeasured_in_calibration(predicted),
                        uncalibrated=uncalibrated_predictions(predicted))
    provenance = collect_provenance(
        records, site={"name": site.name, "source": str(site.source), "sha256": site.digest},
        repo=plan.base, command=_command_line(args, config_path),
        net_file=net_file_digest(plan.net(args.experiment)))
    ctx = ReportContext(experiment=args.experiment, site=site.name, device=site.config["device"]["name"],
                        net=exp["net"], site_digest=site.digest, site_source=str(site.source),
                        description=exp.get("description", ""), provenance=provenance,
                        framework=exp["framework"], precision=exp["precision"])
    if args.store:
        from firescale.store.database import store_url
        from firescale.store.runs import RunContext

        # 'site': $FIRESCALE_RESULTS_URL where it is set, else the site's own store
        url = store_url(None if args.store == "site" else args.store, site)
        context = RunContext(commit=provenance["git"]["commit"], dirty=provenance["git"]["dirty"],
                             hardware=ctx.device, tolerance=tolerance, predictions=points or {},
                             framework=exp["framework"], precision=exp["precision"])
        found = _store_runs(records, context)
        ctx = replace(ctx, against_last=_against_last(url, site.name, args.experiment, found, str(results)))
    written = write_memory_and_batch_figures(plan, args.experiment, records, args.out)
    ctx = replace(ctx, figures_beside=tuple(p.stem for p in written if p.suffix == ".png"))
    written += write_report(summary, ctx, args.out)
    for row in summary.rows:
        verdict = "baseline" if row.baseline else (row.parity.verdict if row.parity else "no baseline")
        speedup = f"{row.speedup.mean:.2f}x" if row.speedup else "n/a"
        print(f"{row.group:<16} top-1 {row.top1.mean * 100:5.1f}%  time {row.time_s.mean:9.2f} s  "
              f"speedup {speedup:>7}  {verdict}")
    for record in summary.failures:
        print(f"{record.point:<16} {record.outcome.upper()}: {record.reason}")
    if summary.baseline_note:
        print(summary.baseline_note)
    print(f"wrote {len(written)} files to {args.out}")
    return 0
