"""Job scripts from Jinja templates: strict (a missing value is an error) and shell-quoted throughout."""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from firescale.cluster.collectives import site_allreduce
from firescale.cluster.horovod import site_horovod_environment
from firescale.cluster.horovod_build import site_gpu_operations
from firescale.cluster.launchers import ENV_LIST_VARIABLE, EnvRef, Placement, wrap
from firescale.cluster.site import SiteProfile
from firescale.cluster.timeouts import site_timeout_environment
from firescale.errors import FirescaleError
from firescale.frameworks import framework
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.spec import JobSpec
from firescale.resources import TEMPLATES

_DIRECTIVE = re.compile(r"#(SBATCH|PBS) [A-Za-z0-9_.:/@%+=,\- ]+")
# ${NAME} or $NAME inside a profile value: the only thing the shell may expand in one.
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
# Run by /bin/sh on a node: prints "firescale-missing HOST PATH" when the program named by $1 is not found
# there (on the PATH it has there, from the folder the ranks start in).  No other program is needed.
_MISSING_PROGRAM = ('command -v -- "$1" >/dev/null 2>&1 || { read -r host < /proc/sys/kernel/hostname; '
                    'printf "firescale-missing %s %s\\n" "$host" "$PATH"; }')


class Shell(str):
    """Text built by firescale itself from quoted parts; the template writes it as it is."""


def quote(value: Any) -> str:
    """One shell word that stands for `value` literally."""
    if value is None:
        raise FirescaleError("a null value cannot be written into a job script")
    if isinstance(value, bool):
        value = "1" if value else "0"
    return shlex.quote(str(value))


def quote_expanding(value: Any) -> Shell:
    """One shell word for `value` in which only a leading `~/` and `$NAME`/`${NAME}` expand at run time.

    Everything else (spaces, `;`, backquotes, `$(...)`) stays literal.
    """
    text = str(value)
    parts: list[str] = []
    if text == "~" or text.startswith("~/"):
        parts.append('"${HOME}"')
        text = text[1:]
    pos = 0
    for match in _REF.finditer(text):
        if match.start() > pos:
            parts.append(shlex.quote(text[pos:match.start()]))
        parts.append('"${%s}"' % (match.group(1) or match.group(2)))
        pos = match.end()
    if pos < len(text) or not parts:
        parts.append(shlex.quote(text[pos:]))
    return Shell("".join(parts))


def shell_command(argv: Sequence[str]) -> Shell:
    """A command line from argv: every word quoted; EnvRef words expand their variable."""
    return Shell(" ".join(f'"${{{a}}}"' if isinstance(a, EnvRef) else quote(a) for a in argv))


def _directive(line: str) -> Shell:
    if not _DIRECTIVE.fullmatch(line):
        raise FirescaleError(
            f"scheduler directive {line!r} may contain only letters, digits, spaces and _.:/@%+=,-; "
            "check the site's account, queue, partition, directives and the job's paths"
        )
    return Shell(line)


def _finalize(value: Any) -> Any:
    return value if isinstance(value, Shell) else quote(value)


def templates_dir() -> Path | None:
    """$FIRESCALE_TEMPLATES when set (a site's own templates), else None: the package's templates."""
    override = os.environ.get("FIRESCALE_TEMPLATES")
    if override and not Path(override).is_dir():
        raise FirescaleError(f"FIRESCALE_TEMPLATES is {override!r}, which is not a folder; point it at a folder "
                             f"of job-script templates or unset it to use the package's")
    return Path(override) if override else None


def _loader(folder: str) -> jinja2.BaseLoader:
    """A folder of templates, or the package's own ("" )."""
    return jinja2.FileSystemLoader(folder) if folder else jinja2.PackageLoader("firescale", TEMPLATES)


@lru_cache(maxsize=4)
def environment(folder: str) -> jinja2.Environment:
    """The Jinja environment: StrictUndefined, every {{ value }} shell-quoted unless built as Shell."""
    env = jinja2.Environment(
        loader=_loader(folder),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["expanding"] = quote_expanding
    env.filters["directive"] = _directive
    env.filters["command"] = shell_command
    env.filters["trusted"] = Shell
    return env


def program_probe(launcher: str, program: str, placement: Placement, options: Sequence[str]) -> list[str]:
    """argv that asks every node of `placement`, through `launcher` as the ranks are started, whether it
    finds `program`; each node that does not prints `firescale-missing HOST PATH`."""
    one_per_node = Placement(ranks=placement.nodes, ranks_per_node=1, cores_per_rank=placement.cores_per_rank,
                             nodes=placement.nodes)
    return wrap(launcher, ["/bin/sh", "-c", _MISSING_PROGRAM, "firescale-probe", program], one_per_node, options)


def job_context(site: SiteProfile, job: JobSpec) -> dict[str, Any]:
    """Everything a template may use, computed here so the templates stay declarative."""
    c = site.config
    scheduler = get_scheduler(site.scheduler)
    placement = site.placement(job.ranks, job.devices_per_rank)
    container = c["environment"]["container"]
    runtime = [container["runtime"], "exec", *container["options"], container["image"]] if container else []
    command = [*runtime, *job.command]
    # A GPU site's job of a framework that asks (TensorFlow's: whether Horovod was built with NCCL) first asks it
    # as its ranks would run it.
    gpu_operations = site_gpu_operations(site) if framework(job.framework, "the job's framework").gpu_build_check \
        else None
    build_check = [*runtime, *c["environment"]["firescale"].split(), "site", "check-horovod",
                   "--gpu-operations", gpu_operations] if gpu_operations else None
    srun_mpi = c["srun_mpi"] if site.launcher == "srun" else None  # other launchers ignore it
    options = [*([f"--mpi={srun_mpi}"] if srun_mpi else []), *c["launcher_options"]]
    launch = command if job.one_process else wrap(site.launcher, command, placement, options)
    env_list = ENV_LIST_VARIABLE.get(site.launcher)
    collectives = {**site_allreduce(site).environment(), **site_horovod_environment(site),
                   **site_timeout_environment(site, job.framework)}
    walltime_signal = site.walltime_signal(job.framework)[0]
    threads = {"OMP_NUM_THREADS": str(placement.cores_per_rank)}
    return {
        "site": c,
        "job": job,
        "placement": placement,
        "directives": [_directive(d) for d in scheduler.directives(site, job)],
        "scheduler": scheduler.name,
        "hosts_command": Shell(scheduler.hosts_command),
        "job_id_variable": Shell(scheduler.job_id_variable or "FIRESCALE_NO_JOB_ID"),
        "environment": c["environment"],
        "exports": {**threads, **collectives, **{k: str(v) for k, v in job.env.items()}},
        "launch": shell_command(launch),
        "program": command[0],
        "probe": shell_command(program_probe(site.launcher, command[0], placement, options)),
        "env_list": Shell(env_list) if env_list else None,
        "srun_mpi": srun_mpi,
        "build_check": shell_command(build_check) if build_check else None,
        "walltime_timer": scheduler.walltime_timer(site, job),
        "walltime_signal": Shell(walltime_signal),
        # what the ranks are sent to snapshot and stop: the walltime signal, USR1 where that is TERM (mpirun
        # would end its ranks on TERM before they snapshot)
        "rank_signal": Shell(walltime_signal if walltime_signal in ("USR1", "USR2") else "USR1"),
    }


def render_job_script(site: SiteProfile, job: JobSpec, *, templates: Path | None = None) -> str:
    """The job script for `job` on `site`; a pure function of its arguments and the templates."""
    folder = templates or templates_dir()
    scheduler = get_scheduler(site.scheduler)
    env = environment(str(folder) if folder else "")
    where = folder or "the package's templates"
    try:
        return env.get_template(scheduler.template).render(job_context(site, job))
    except jinja2.UndefinedError as exc:
        raise FirescaleError(f"template {scheduler.template} in {where}: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise FirescaleError(f"template {exc.name} not found in {where}") from None
