"""`firescale site lint NAME|PATH`: schema, job scripts (rendered, `bash -n`), sweep limits, allreduce, memory."""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from firescale.cluster.collectives import site_allreduce
from firescale.cluster.site import SiteProfile, check_site
from firescale.errors import FirescaleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("site", help="a site name (./site/<name>/site.yaml, else on $FIRESCALE_SITE_PATH) "
                        "or a path to a site folder or site.yaml")
    parser.add_argument("--config", default=None, help="experiments file whose sweep is checked "
                        "(default: ./workflow/config.yaml when there is one; else the site alone)")


def bash_syntax_error(script: str) -> str | None:
    """bash -n's complaint about `script`, or None when it parses."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as fh:
        fh.write(script)
    try:
        proc = subprocess.run(["bash", "-n", fh.name], capture_output=True, text=True)
    finally:
        Path(fh.name).unlink()
    return proc.stderr.strip() or f"bash -n exited {proc.returncode}" if proc.returncode else None


def lint_site(site_arg: str, config_path: str | None = None) -> list[str]:
    """Every problem with a site: schema, rendering, bash syntax, and its sweep against its limits."""
    from firescale.jobs.render import render_job_script
    from firescale.jobs.spec import JobSpec
    from firescale.predict.memory_fit import experiment_fits
    from firescale.sweep.config import experiments_for, load_config
    from firescale.sweep.jobs import job_for_point
    from firescale.sweep.paths import CONFIG_FILE
    from firescale.sweep.plan import SweepPlan

    path, config, problems = check_site(site_arg)
    if problems:
        return problems
    site = SiteProfile(name=config["name"], source=path.resolve(), config=config)

    jobs = [JobSpec(name=f"lint-{n}", ranks=n, walltime_s=60, command=["firescale", "--version"],
                    workdir=Path("/tmp/firescale-lint"), log_file=Path("/tmp/firescale-lint/job.log"),
                    status_file=Path("/tmp/firescale-lint/status.json"))
            for n in sorted({1, site.gpus_per_node})]
    cfg_file = Path(config_path) if config_path else CONFIG_FILE  # the site alone when there is none here
    if cfg_file.exists():
        cfg = load_config(cfg_file, {"site": site.name})
        plan = SweepPlan.build(cfg, site, experiments=experiments_for(cfg, site.name), source=cfg_file,
                               check_limits=False)
        for experiment, points in plan.points.items():
            limits = plan.limit_problems[experiment]
            problems += [f"{cfg_file}: experiment {experiment}: {e}" for e in limits]
            if not limits:
                jobs += [job_for_point(plan, experiment, p) for p in points]
            problems += [f"{cfg_file}: experiment {experiment}: {f.problem}"
                         for f in experiment_fits(plan, experiment, points) if f.problem]
    elif config_path:
        raise FirescaleError(f"{cfg_file}: no such experiments file")
    for job in jobs:
        try:
            script = render_job_script(site, job)
        except FirescaleError as exc:
            problems.append(f"{path}: rendering job {job.name}: {exc}")
            continue
        error = bash_syntax_error(script)
        if error:
            problems.append(f"{path}: the job script for {job.name} does not parse: {error}")
    for warning in site_allreduce(site).warnings():   # the site runs, but not everything it asks for
        print(f"warning: {path}: {warning}")
    print(f"site {site.name}: {len(jobs)} job script(s) rendered and checked with bash -n"
          + (" (archival: rendered, never submitted)" if site.archival else ""))
    return problems


def run(args: argparse.Namespace) -> int:
    problems = lint_site(args.site, args.config)
    for problem in problems:
        print(f"error: {problem}")
    if problems:
        print(f"site lint: {len(problems)} problem(s)")
        return 1
    print("site lint: OK")
    return 0
