"""`firescale site render`: write the job script of one sweep point (or every point) for a site."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from firescale.atomic import atomic_write_text, shared_mode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="site name or path")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--point", help="a point's name (baseline, g2-b64-r0, ...); default: every point")
    parser.add_argument("--config", default=None, help="experiments file (default: ./workflow/config.yaml)")
    parser.add_argument("--out", help="file (with --point) or folder to write to; default: standard output. "
                        "Beside each script, NAME.json describes the point for `firescale sweep run`.")


def run(args: argparse.Namespace) -> int:
    from firescale.jobs.render import render_job_script
    from firescale.sweep.jobs import job_for_point, point_record
    from firescale.sweep.plan import load_plan

    plan = load_plan(args.site, args.config, experiments=[args.experiment])
    points = [plan.point(args.experiment, args.point)] if args.point else plan.points[args.experiment]
    for point in points:
        script = render_job_script(plan.site, job_for_point(plan, args.experiment, point))
        if not args.out:
            sys.stdout.write(script)
            continue
        target = Path(args.out) if args.point else Path(args.out) / f"{point.name}.sh"
        atomic_write_text(target, script)
        target.chmod(shared_mode(directory=True))  # rwx as the umask allows, as for a new program
        point_record(plan, args.experiment, point).write(target.with_suffix(".json"))
    return 0
