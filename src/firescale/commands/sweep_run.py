"""`firescale sweep run`: submit one point's job script (or run it here), watch it, resubmit, collect."""
from __future__ import annotations

import argparse
from pathlib import Path

from firescale.errors import FirescaleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="site name or path")
    parser.add_argument("--script", required=True, type=Path, help="the rendered job script")
    parser.add_argument("--point-file", required=True, type=Path,
                        help="the point's JSON, written beside the script by `site render`")
    parser.add_argument("--collect", nargs=2, required=True, type=Path, metavar=("RESULT", "STATUS"),
                        help="where to write the point's run record and the job's status file")
    parser.add_argument("--prediction", type=Path, default=None,
                        help="the experiment's predict.json: a point without a stall_after of its own is found "
                             "stalled after 100 of its predicted iterations or 2 evaluations, at least the site's "
                             "limits.stall_after_floor (that floor alone without it)")
    parser.add_argument("--poll-seconds", type=float, default=None,
                        help="polling interval (default: the site's poll_seconds): on a scheduler the first "
                             "(else 10 s), growing to 120 s; here (no scheduler) every interval (else 1 s: looking "
                             "at a local process is free)")


def run(args: argparse.Namespace) -> int:
    from firescale.cluster.site import load_site
    from firescale.jobs.lock import run_lock
    from firescale.jobs.outcome import ResubmitRules
    from firescale.sweep.records import read_point_record
    from firescale.sweep.run import PointRun, Polling, collect, run_watched, site_scheduler, stall_watch

    site = load_site(args.site)
    if site.archival:
        raise FirescaleError(
            f"site {site.name} is archival (a retired machine): its job scripts are rendered "
            f"(`snakemake --profile {site.name} render`) and predicted, never submitted")
    point = read_point_record(args.point_file)
    if not args.script.is_file():
        raise FirescaleError(f"{args.script}: no such job script")
    run_dir = Path(point.run_dir)
    polling = Polling.for_site(site, args.poll_seconds)
    log = lambda line: print(line, flush=True)  # noqa: E731
    stall, words = stall_watch(point, site, args.prediction)
    log(f"watching {point.point}'s heartbeat: {words}")
    point_run = PointRun(scheduler=site_scheduler(site),
                         script=args.script.resolve(), run_dir=run_dir,
                         max_resubmits=min(point.max_resubmits, site.max_resubmits), polling=polling, log=log,
                         rules=ResubmitRules.for_site(site, point.walltime, point.framework), stall=stall)
    with run_lock(run_dir, f"firescale sweep run {site.name} {point.experiment}/{point.point}") as lock:
        verdict, submissions = run_watched(point_run, lock)
        record = collect(point, verdict, submissions, run_dir, args.collect[0], args.collect[1])
    if record["outcome"] != "succeeded":
        print(f"firescale: point {point.point} FAILED: {record['reason']}\n{record['log_tail']}", flush=True)
    return 0

