"""`firescale sweep calibrate`: reuse the site's kept calibration of what the experiment's would measure, else submit
its calibration job (or run it here), watch it, collect and keep what it measured."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from firescale.errors import FirescaleError

if TYPE_CHECKING:
    from firescale.sweep.plan import SweepPlan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="site name or path")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--config", default=None, help="experiments file (default: ./workflow/config.yaml)")
    parser.add_argument("--script", required=True, type=Path,
                        help="the calibration job's script (`firescale site render --calibration`)")
    parser.add_argument("--out", required=True, type=Path, help="where to write the calibration it measured or reused")
    parser.add_argument("--poll-seconds", type=float, default=None,
                        help="polling interval (default: the site's poll_seconds, as `firescale sweep run`)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure afresh in a job even when the site keeps a calibration of the same key")


def run(args: argparse.Namespace) -> int:
    from firescale.atomic import atomic_write_text
    from firescale.predict.calibration_key import calibration_key
    from firescale.predict.calibration_library import calibration_file, find_kept, keep, library_dir
    from firescale.sweep.plan import load_plan

    plan = load_plan(args.site, args.config, experiments=[args.experiment])
    site = plan.site
    if site.archival:
        raise FirescaleError(f"site {site.name} is archival (a retired machine): its calibration job is rendered, "
                             "never submitted")
    key, library = calibration_key(plan, args.experiment), library_dir(site)
    kept = None if args.recalibrate else find_kept(library, key)
    if kept is not None:
        atomic_write_text(args.out, calibration_file(library, key).read_text())
        print(f"reused calibration {key.digest} measured {kept.measured_at} for {key.describe()} (by experiment "
              f"{kept.experiment}; --recalibrate measures afresh) -> {args.out}")
        return 0
    made = _measure(plan, args)
    keep(library, key, made, args.experiment)
    atomic_write_text(args.out, made.read_text())
    print(f"calibration of {args.experiment} on site {site.name} (job in {made.parent}) -> {args.out}; kept as "
          f"calibration {key.digest} in {library} for {key.describe()}")
    return 0


def _measure(plan: SweepPlan, args: argparse.Namespace) -> Path:
    """Run the experiment's calibration job, watch it and check what it wrote; the calibration's path."""
    from firescale.jobs.lock import run_lock
    from firescale.jobs.outcome import ResubmitRules
    from firescale.predict.calibrate import load_calibration
    from firescale.sweep.jobs import calibration_dir
    from firescale.sweep.paths import CALIBRATION_FILE
    from firescale.sweep.run import PointRun, Polling, log_tail, run_watched, site_scheduler

    site = plan.site
    if not args.script.is_file():
        raise FirescaleError(f"{args.script}: no such job script")
    folder = calibration_dir(plan, args.experiment)
    made = folder / CALIBRATION_FILE
    job = PointRun(scheduler=site_scheduler(site),
                   script=args.script.resolve(), run_dir=folder, max_resubmits=0,
                   polling=Polling.for_site(site, args.poll_seconds),
                   log=lambda line: print(line, flush=True), rules=ResubmitRules.for_site(site, site.default_walltime),
                   finished=lambda d: (d / CALIBRATION_FILE).is_file(),
                   missing=f"the calibration wrote no {CALIBRATION_FILE}")
    with run_lock(folder, f"firescale sweep calibrate {site.name} {args.experiment}") as lock:
        made.unlink(missing_ok=True)                # a calibration measures afresh; nothing stale is taken
        shutil.rmtree(folder / "work", ignore_errors=True)
        verdict, _ = run_watched(job, lock)
    if verdict.outcome != "succeeded":
        raise FirescaleError(f"the calibration job of {args.experiment} on site {site.name} failed: {verdict.reason}"
                             f"; its log is {folder / 'job.log'}:\n{log_tail(folder / 'job.log')}")
    load_calibration(made)                           # a file the predictions can read, or one sentence why not
    return made
