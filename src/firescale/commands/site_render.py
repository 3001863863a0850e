"""`firescale site render`: write the job script of one sweep point (or every point) for a site."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..atomic import atomic_write_json, atomic_write_text, shared_mode
from ..errors import FirescaleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="site name or path")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--point", help="a point's name (baseline, g2-b64-r0, ...); default: every point")
    parser.add_argument("--config", default=None, help="experiments file (default: workflow/config.yaml)")
    parser.add_argument("--out", help="file (with --point) or folder to write to; default: standard output. "
                        "Beside each script, NAME.json describes the point for `firescale sweep run`.")


def run(args: argparse.Namespace) -> int:
    from ..jobs import job_for_point, point_record
    from ..render import render_job_script
    from ..site import load_site
    from ..sweep import limit_errors, load_config, plan_sweep, repo_root, solver_base_lr, sweep_walltime

    site = load_site(args.site)
    cfg_file = Path(args.config) if args.config else repo_root() / "workflow" / "config.yaml"
    cfg = load_config(cfg_file, {"site": site.name})
    if args.experiment not in cfg["experiments"]:
        raise FirescaleError(f"{cfg_file}: no experiment {args.experiment!r}; known: {', '.join(sorted(cfg['experiments']))}")
    points = plan_sweep(cfg, args.experiment, site.name, solver_base_lr(cfg, args.experiment))
    walltime = sweep_walltime(cfg, args.experiment, site)
    errors = limit_errors(points, site, walltime)
    if errors:
        raise FirescaleError(errors[0])
    if args.point:
        points = [p for p in points if p.name == args.point] or _unknown_point(args.point, points)
    for point in points:
        script = render_job_script(site, job_for_point(site, cfg, args.experiment, point, walltime))
        if not args.out:
            sys.stdout.write(script)
            continue
        target = Path(args.out) if args.point else Path(args.out) / f"{point.name}.sh"
        atomic_write_text(target, script)
        target.chmod(shared_mode(directory=True))  # rwx as the umask allows, as for a new program
        atomic_write_json(target.with_suffix(".json"), point_record(site, cfg, args.experiment, point, walltime))
    return 0


def _unknown_point(name: str, points: list) -> list:
    raise FirescaleError(f"no sweep point {name!r}; points: {', '.join(p.name for p in points)}")
