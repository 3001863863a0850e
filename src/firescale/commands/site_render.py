"""`firescale site render`: write the job script of one sweep point (or every point, or the calibration) for a site."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from firescale.atomic import atomic_write_text, shared_mode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="site name or path")
    parser.add_argument("--experiment", required=True)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--point", help="a point's name (baseline, g2-b64-r0, ...); default: every point")
    which.add_argument("--calibration", action="store_true",
                       help="the experiment's calibration job instead (`firescale sweep calibrate` submits it)")
    parser.add_argument("--config", default=None, help="experiments file (default: ./workflow/config.yaml)")
    parser.add_argument("--out", help="file (with --point or --calibration) or folder to write to; default: standard "
                        "output. Beside each point's script, NAME.json describes the point for `firescale sweep run`.")


def run(args: argparse.Namespace) -> int:
    from firescale.jobs.render import render_job_script
    from firescale.sweep.jobs import calibration_job, job_for_point, point_record
    from firescale.sweep.plan import load_plan

    plan = load_plan(args.site, args.config, experiments=[args.experiment])
    if args.calibration:
        script = render_job_script(plan.site, calibration_job(plan, args.experiment))
        if args.out:
            _write_program(script, Path(args.out))
        else:
            sys.stdout.write(script)
        return 0
    points = [plan.point(args.experiment, args.point)] if args.point else plan.points[args.experiment]
    for point in points:
        script = render_job_script(plan.site, job_for_point(plan, args.experiment, point))
        if not args.out:
            sys.stdout.write(script)
            continue
        target = _write_program(script, Path(args.out) if args.point else Path(args.out) / f"{point.name}.sh")
        point_record(plan, args.experiment, point).write(target.with_suffix(".json"))
    return 0


def _write_program(script: str, target: Path) -> Path:
    """`script` written to `target` as a program (rwx as the umask allows, as for a new program)."""
    atomic_write_text(target, script)
    target.chmod(shared_mode(directory=True))
    return target
