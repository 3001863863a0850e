"""`firescale site lint NAME|PATH`: schema, what jobs need, the profile, job scripts (`bash -n`), limits, memory."""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from firescale.cluster.collectives import site_allreduce
from firescale.cluster.site import SITE_FILE, SiteProfile, check_site
from firescale.errors import FirescaleError
from firescale.jobs.spec import JobSpec


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


def lint_site(site_arg: str, config_path: str | None = None) -> tuple[list[str], list[str]]:
    """Every problem with a site (schema, what its jobs need, its profile, rendering, bash syntax, its sweep
    against its limits) and every warning (it runs, but maybe not as meant); notes are printed."""
    from firescale.cluster.job_needs import job_needs
    from firescale.cluster.snakemake_profile import profile_findings
    from firescale.jobs.render import render_job_script

    path, config, problems = check_site(site_arg)
    if problems:
        return problems, []
    site = SiteProfile(name=config["name"], source=path.resolve(), config=config)
    findings = [(f"{path}: {f.text}", f) for f in job_needs(config)]
    findings += [(f.text, f) for f in profile_findings(path.parent, site.name)] if path.name == SITE_FILE else []
    problems += [text for text, f in findings if f.level == "error"]
    warnings = [text for text, f in findings if f.level == "warning"]
    for note in (f for _, f in findings if f.level == "note"):
        print(f"site {site.name}: {note.text}")
    jobs, sweep_problems, unlisted = _sweep_jobs(site, config_path)
    problems += sweep_problems
    warnings += unlisted
    for job in jobs:
        try:
            script = render_job_script(site, job)
        except FirescaleError as exc:
            problems.append(f"{path}: rendering job {job.name}: {exc}")
            continue
        error = bash_syntax_error(script)
        if error:
            problems.append(f"{path}: the job script for {job.name} does not parse: {error}")
    warnings += [f"{path}: {w}" for w in site_allreduce(site).warnings()]  # it runs, but not all it asks for
    print(f"site {site.name}: {len(jobs)} job script(s) rendered and checked with bash -n"
          + (" (the site alone, no sweep point)" if all(j.name.startswith("lint-") for j in jobs) else "")
          + (" (archival: rendered, never submitted)" if site.archival else ""))
    return problems, warnings


def _site_jobs(site: SiteProfile) -> list[JobSpec]:
    """A job of one rank and one of a full node: the site's own scripts, whatever the sweep."""
    return [JobSpec(name=f"lint-{n}", ranks=n, walltime_s=60, command=["firescale", "--version"],
                    workdir=Path("/tmp/firescale-lint"), log_file=Path("/tmp/firescale-lint/job.log"),
                    status_file=Path("/tmp/firescale-lint/status.json"))
            for n in sorted({1, site.gpus_per_node})]


def _sweep_jobs(site: SiteProfile, config_path: str | None) -> tuple[list[JobSpec], list[str], list[str]]:
    """The jobs to render (the site's own, then every point of the experiments that list the site), the
    sweep's problems, and the warning that no experiment lists the site (then no point is planned)."""
    from firescale.predict.memory_fit import experiment_fits
    from firescale.sweep.config import experiments_for, load_config
    from firescale.sweep.jobs import job_for_point
    from firescale.sweep.paths import CONFIG_FILE
    from firescale.sweep.plan import SweepPlan

    jobs = _site_jobs(site)
    cfg_file = Path(config_path) if config_path else CONFIG_FILE  # the site alone when there is none here
    if not cfg_file.exists():
        if config_path:
            raise FirescaleError(f"{cfg_file}: no such experiments file")
        return jobs, [], []
    cfg = load_config(cfg_file, {"site": site.name})
    experiments = experiments_for(cfg, site.name)
    if not experiments:
        return jobs, [], [
            f"{cfg_file}: no experiment lists site {site.name!r} under its 'sites', so the workflow would stop "
            f"before planning any point; add `{site.name}: null` (or its own sweep, e.g. `{site.name}: "
            f"{{gpus: [1, {site.gpus_per_node}]}}`) under 'sites' of each experiment it should run "
            f"({', '.join(sorted(cfg['experiments']))})"]
    problems: list[str] = []
    plan = SweepPlan.build(cfg, site, experiments=experiments, source=cfg_file, check_limits=False)
    for experiment, points in plan.points.items():
        limits = plan.limit_problems[experiment]
        problems += [f"{cfg_file}: experiment {experiment}: {e}" for e in limits]
        if not limits:
            jobs += [job_for_point(plan, experiment, p) for p in points]
        problems += [f"{cfg_file}: experiment {experiment}: {f.problem}"
                     for f in experiment_fits(plan, experiment, points) if f.problem]
    return jobs, problems, []


def run(args: argparse.Namespace) -> int:
    problems, warnings = lint_site(args.site, args.config)
    for warning in warnings:
        print(f"warning: {warning}")
    for problem in problems:
        print(f"error: {problem}")
    if problems:
        print(f"site lint: {len(problems)} problem(s)")
        return 1
    print("site lint: OK" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    return 0
