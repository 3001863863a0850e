"""Directives per scheduler: Slurm never requeues by itself, PBS Pro and Torque/Moab each get their own words."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

from site_helpers import site_copy

from firescale.cluster.site import load_site
from firescale.jobs.render import render_job_script
from firescale.jobs.spec import JobSpec


def job(ranks: int, walltime_s: int = 5400, command=("firescale", "train"), run=Path("/shared/r/g")) -> JobSpec:
    return JobSpec(name=f"fs-directives-g{ranks}", ranks=ranks, walltime_s=walltime_s, command=list(command),
                   workdir=run, log_file=run / "job.log", status_file=run / "status.json")


def pbs_site(tmp_path, scheduler: str, **edits):
    def edit(d):
        d.update(name=f"{scheduler}-site", scheduler=scheduler, launcher="mpirun", partition=None, qos=None,
                 queue="gpu", **edits)
    return load_site(site_copy(tmp_path, "ib-cluster", edit, folder=f"{scheduler}-site"))


def test_slurm_jobs_are_never_requeued_by_slurm():
    script = render_job_script(load_site("ib-cluster"), job(8))
    assert "#SBATCH --no-requeue\n" in script and "--requeue\n" not in script.replace("--no-requeue", "")


def test_a_vcluster_2x2_job_has_its_node_to_itself():
    """Two ranks a node there are turns on one core: a 1-rank job asks for its whole node, so that Slurm (which
    counts two CPUs a node) never places two of them, two baseline repeats, on one core at once."""
    site = load_site("vcluster-2x2")
    assert site.gpus_per_node == 2 and site.cores_per_rank == 1
    script = render_job_script(site, job(1))
    assert "#SBATCH --exclusive\n" in script and "#SBATCH --nodes=1\n" in script


def test_pbs_pro_asks_with_select_chunks_and_no_moab_signal(tmp_path):
    script = render_job_script(pbs_site(tmp_path, "pbs"), job(8))
    assert "#PBS -l select=2:ncpus=40:mpiprocs=4:ngpus=4\n" in script and "#PBS -l place=scatter\n" in script
    assert "-l signal=" not in script and "-l nodes=" not in script
    assert "sleep 5100 &" in script  # 5400 s walltime - 300 s lead: the job signals itself


def test_torque_asks_with_nodes_and_ppn_and_moab_sends_the_signal(tmp_path):
    script = render_job_script(pbs_site(tmp_path, "torque"), job(8))
    assert "#PBS -l nodes=2:ppn=40:gpus=4\n" in script and "#PBS -l signal=USR1@300\n" in script
    assert "select=" not in script and "sleep 5100" not in script
    assert "#PBS -N fs-directives-g\n" in script  # Torque's 15 characters


def test_the_pbs_pro_timer_signals_the_job_within_its_lead_time(tmp_path):
    """A real run of the job body: a 12 s walltime with a 10 s lead; the ranks get SIGUSR1 about 2 s in.  The
    site's device is this machine's CPU core: a GPU site's job would first refuse this machine's Horovod,
    built without NCCL (tests/site/test_horovod_check.py)."""
    walltime_s, lead_s = 12, 10
    site = pbs_site(tmp_path, "pbs", launcher_options=["--oversubscribe"], environment={"variables": {}},
                    node={"gpus": 1, "cores": 1, "memory_gb": 4},
                    device=load_site("local").config["device"],
                    interconnect=load_site("local").config["interconnect"],
                    walltime_signal={"signal": "USR1", "seconds_before": lead_s})
    run = tmp_path / "run"
    code = ("import signal, sys, time, pathlib\n"
            "signal.signal(signal.SIGUSR1,\n"
            "              lambda *a: (pathlib.Path('snapshot.txt').write_text('saved'), sys.exit(3)))\n"
            "time.sleep(60)\n")
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(site, job(1, walltime_s, [sys.executable, "-c", code], run)))
    started = time.time()
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=90)
    took = time.time() - started
    status = json.loads((run / "status.json").read_text())
    assert (run / "snapshot.txt").read_text() == "saved", proc.stderr
    assert status["signal"] == "USR1" and status["signal_time"] and status["exit_code"] == 3
    # the signal came when due, the lead time before the walltime (2 s in; the stamps are whole seconds), and the
    # job ended on it: a timer that waited out the walltime, or fired at once, fails here
    stamp = lambda key: dt.datetime.strptime(status[key], "%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    due = walltime_s - lead_s
    assert due - 1 <= (stamp("signal_time") - stamp("start")).total_seconds() <= due + 2, status
    assert due - 0.5 < took < walltime_s
