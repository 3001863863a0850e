"""The environment a job inherits from its submission: relative search-path entries made absolute against the
directory it was submitted from (issue 23), for every scheduler; and a job whose ranks' program is not on a
node's PATH naming that node and PATH."""
from __future__ import annotations

import copy
import json
import os
import socket
from pathlib import Path

import pytest
from fake_scheduler import FakeJob, FakeScheduler

from firescale.cluster.site import SiteProfile, load_site
from firescale.errors import FirescaleError
from firescale.jobs.environment import submission_environment
from firescale.jobs.render import render_job_script
from firescale.jobs.schedulers import get_scheduler
from firescale.jobs.spec import JobSpec
from firescale.sweep.run import PointRun, Polling

SUBMIT = Path("/work/checkout")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def test_relative_entries_are_joined_to_the_submission_directory():
    env = submission_environment({"PATH": ".venv/bin:/usr/bin:./tools:../up/bin",
                                  "PYTHONPATH": "src", "LD_LIBRARY_PATH": "/opt/lib:lib64",
                                  "VIRTUAL_ENV": ".venv", "OTHER": "rel/dir"}, SUBMIT)
    assert env["PATH"] == "/work/checkout/.venv/bin:/usr/bin:/work/checkout/tools:/work/checkout/../up/bin"
    assert env["PYTHONPATH"] == "/work/checkout/src"
    assert env["LD_LIBRARY_PATH"] == "/opt/lib:/work/checkout/lib64"
    assert env["VIRTUAL_ENV"] == "/work/checkout/.venv"
    assert env["OTHER"] == "rel/dir"                                  # not a search path: untouched


def test_an_empty_entry_is_the_submission_directory_and_an_empty_value_stays_empty():
    env = submission_environment({"PATH": ":/usr/bin::/bin:", "LD_LIBRARY_PATH": ":/opt/lib", "PYTHONPATH": "",
                                  "VIRTUAL_ENV": ""}, SUBMIT)
    assert env["PATH"] == "/work/checkout:/usr/bin:/work/checkout:/bin:/work/checkout"
    assert env["LD_LIBRARY_PATH"] == "/work/checkout:/opt/lib"
    assert env["PYTHONPATH"] == "" and env["VIRTUAL_ENV"] == ""


def test_absolute_entries_stay_as_they_are_and_a_tilde_is_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/ada")
    environ = {"PATH": "/a/bin:/b/../c", "PYTHONPATH": "~/lib"}
    env = submission_environment(environ, SUBMIT)
    assert env["PATH"] == "/a/bin:/b/../c" and env["PYTHONPATH"] == "/home/ada/lib"
    assert submission_environment({"PATH": SYSTEM_PATH}, Path("/x:y")) == {"PATH": SYSTEM_PATH}


def test_a_relative_entry_under_a_directory_with_a_colon_is_refused_naming_it():
    with pytest.raises(FirescaleError, match=r"^PATH has the relative entry '\.venv/bin', .*/work/a:b, contains ':'"):
        submission_environment({"PATH": "/usr/bin:.venv/bin"}, Path("/work/a:b"))


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "torque"])
def test_sbatch_and_qsub_run_with_the_absolute_environment(tmp_path, monkeypatch, scheduler):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f".venv/bin:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", "src")
    fake = FakeScheduler(run_dir=tmp_path / "run", script=[FakeJob(["R"])])
    get_scheduler(scheduler, fake).submit(tmp_path / "job.sh", tmp_path / "run")
    (submitted,) = [env for argv, env in zip(fake.calls, fake.envs, strict=True) if argv[0] in ("sbatch", "qsub")]
    assert submitted is not None
    assert submitted["PATH"] == f"{tmp_path}/.venv/bin:{os.environ['PATH'].split(':', 1)[1]}"
    assert submitted["PYTHONPATH"] == f"{tmp_path}/src"
    assert os.environ["PATH"].startswith(".venv/bin:")             # this process keeps its own


def _local_site(launcher: str = "mpirun") -> SiteProfile:
    local = load_site("local")
    config = copy.deepcopy(local.config)
    config["launcher"] = launcher
    return SiteProfile(name=local.name, source=local.source, config=config)


def _run_local(tmp_path: Path, command: list[str]) -> tuple[str, str, Path]:
    """Render `command` as a one-rank job of the local site, submit it from the current directory, wait."""
    run = tmp_path / "run"
    job = JobSpec(name="fs-submit-env", ranks=1, walltime_s=300, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=command)
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(_local_site(), job))
    point = PointRun(scheduler=get_scheduler("local"), script=script, run_dir=run, max_resubmits=0,
                     log=lambda line: None, polling=Polling(first=0.1, factor=1.5, most=0.5, status_wait=10))
    verdict, _ = point.run()
    log = (run / "job.log").read_text() if (run / "job.log").exists() else ""
    return verdict.outcome, f"{verdict.reason}\n{log}", run


# A program that proves it ran, in the folder the job starts in (its run folder), as a rank would.
PROGRAM = '#!/bin/sh\nprintf \'{"status": "finished"}\' > result.json\n'


@pytest.mark.mpi
def test_a_local_job_finds_its_program_through_a_relative_path_entry(tmp_path, monkeypatch):
    submit = tmp_path / "checkout"
    (submit / "tools").mkdir(parents=True)
    program = submit / "tools" / "fs-rank-program"
    program.write_text(PROGRAM)
    program.chmod(0o755)
    monkeypatch.chdir(submit)
    monkeypatch.setenv("PATH", f"tools:{os.environ['PATH']}")
    outcome, words, run = _run_local(tmp_path, ["fs-rank-program"])
    assert outcome == "succeeded", words
    assert json.loads((run / "result.json").read_text()) == {"status": "finished"}


@pytest.mark.mpi
def test_a_program_missing_on_the_node_is_named_with_the_node_and_its_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = f"{tmp_path}/nowhere:{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    outcome, words, run = _run_local(tmp_path, ["fs-no-such-program"])
    status = json.loads((run / "status.json").read_text())
    assert outcome == "failed"
    assert status["exit_code"] == 127, words
    assert status["reason"].startswith(f"fs-no-such-program is not found on node {socket.gethostname()}, "
                                       f"whose PATH is {path}; "), words
    reason = words.splitlines()[0]
    assert reason.startswith("exit code 127 (status.json)") and reason.endswith(f": {status['reason']}"), reason
