"""Job scripts: golden files per site and scheduler, strictness, quoting, and the job body run for real."""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from site_helpers import site_copy

from firescale.cluster.launchers import LAUNCHERS
from firescale.cluster.site import load_site
from firescale.errors import FirescaleError
from firescale.jobs.render import environment, quote_expanding, render_job_script
from firescale.jobs.schedulers import SCHEDULERS
from firescale.jobs.spec import JobSpec

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("FIRESCALE_UPDATE_GOLDEN") == "1"


def fixed_job(ranks: int) -> JobSpec:
    run = Path("/shared/firescale/results/demo") / f"g{ranks}"
    return JobSpec(name=f"fs-demo-g{ranks}", ranks=ranks, walltime_s=5400,
                   command=["firescale", "train", "--net", "nin", "--out", str(run)],
                   workdir=run, log_file=run / "job.log", status_file=run / "status.json",
                   env={"FIRESCALE_RUN_DIR": str(run)})


def _variants(tmp_path):
    """Every shipped site with its own scheduler, plus plain PBS and Slurm+mpirun variants."""
    sites = {name: load_site(name) for name in ("titan", "ib-cluster", "local", "vcluster")}
    sites["pbs-mpirun"] = load_site(site_copy(tmp_path, "ib-cluster", lambda d: d.update(
        name="pbs-mpirun", scheduler="pbs", launcher="mpirun", srun_mpi=None, partition=None, qos=None,
        queue="gpu"), folder="pbs-mpirun"))
    sites["slurm-horovodrun"] = load_site(site_copy(tmp_path, "ib-cluster", lambda d: d.update(
        name="slurm-horovodrun", launcher="horovodrun", srun_mpi=None), folder="slurm-horovodrun"))
    return sites


@pytest.mark.parametrize("variant", ["titan", "ib-cluster", "local", "vcluster", "pbs-mpirun", "slurm-horovodrun",
                                     "ib-cluster-pytorch"])
@pytest.mark.parametrize("ranks", [1, 8])
def test_golden_job_scripts(tmp_path, variant, ranks):
    """Each site's TensorFlow job; and a GPU site's PyTorch job, where NCCL runs: its walltime signal USR2, NCCL's
    async error handling and the process group's timeout."""
    framework = "pytorch" if variant.endswith("-pytorch") else "tensorflow"
    site = _variants(tmp_path)[variant.removesuffix("-pytorch")]
    if site.nodes_for(ranks) > site.max_nodes:
        ranks = site.gpus_per_node
    script = render_job_script(site, dataclasses.replace(fixed_job(ranks), framework=framework))
    golden = GOLDEN / f"{variant}-{ranks}.sh"
    if UPDATE or not golden.exists():
        if not UPDATE:
            pytest.fail(f"no golden file {golden.name}; create it on purpose with "
                        f"FIRESCALE_UPDATE_GOLDEN=1 pytest {__file__}")
        golden.write_text(script)
    expected = golden.read_text()
    if script != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), script.splitlines(True), str(golden),
                                            "rendered"))
        pytest.fail(f"the rendered job script changed:\n{diff}\nIf the change is intended, update the golden files "
                    f"on purpose: FIRESCALE_UPDATE_GOLDEN=1 pytest {__file__}, and review the diff before committing.")


def test_rendering_is_deterministic_and_bash_parses_every_combination(tmp_path):
    for scheduler in SCHEDULERS:
        for launcher in LAUNCHERS:
            if launcher == "srun" and scheduler != "slurm":
                continue
            path = site_copy(tmp_path, "ib-cluster", lambda d, scheduler=scheduler, launcher=launcher: d.update(
                name=f"{scheduler}-{launcher}", scheduler=scheduler, launcher=launcher,
                partition=None if scheduler != "slurm" else "gpu", qos=None,
                limits={**d["limits"], "max_nodes": 1 if scheduler == "local" else 32}),
                folder=f"{scheduler}-{launcher}")
            site = load_site(path)
            first = render_job_script(site, fixed_job(4))
            assert first == render_job_script(site, fixed_job(4))
            script = tmp_path / f"{scheduler}-{launcher}.sh"
            script.write_text(first)
            proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            assert proc.returncode == 0, f"{scheduler}+{launcher}: {proc.stderr}"


def test_a_rank_of_two_devices_halves_the_ranks_per_node_for_every_scheduler_and_launcher(tmp_path):
    """A replica split over 2 GPUs (a sweep point's layer plan): 4 ranks on 4-GPU nodes go 2 to a node, each
    with the cores of its 2 GPUs, and the node's GPUs all requested."""
    sites = _variants(tmp_path)
    job = fixed_job(4)
    split = JobSpec(**{**vars(job), "devices_per_rank": 2})
    pbs = render_job_script(sites["pbs-mpirun"], split)
    assert "#PBS -l select=2:ncpus=40:mpiprocs=2:ngpus=4" in pbs and "ppr:2:node:PE=20" in pbs
    assert "#PBS -l select=1:ncpus=40:mpiprocs=4:ngpus=4" in render_job_script(sites["pbs-mpirun"], job)
    horovod = render_job_script(sites["slurm-horovodrun"], split)
    assert "#SBATCH --ntasks-per-node=2" in horovod and "sed 's/$/:2/'" in horovod
    assert "#SBATCH --cpus-per-task=20" in horovod and "#SBATCH --gpus-per-node=4" in horovod
    with pytest.raises(FirescaleError, match="a rank of 2 devices does not fit on one node of site titan"):
        render_job_script(sites["titan"], split)


def test_directives_follow_the_scheduler():
    titan = render_job_script(load_site("titan"), fixed_job(128))
    assert "#PBS -l nodes=128\n" in titan and "#PBS -l walltime=01:30:00" in titan
    assert "#PBS -l signal=USR1@300" in titan and "#PBS -A CSC103" in titan
    assert "aprun -n 128 -N 1 -d 16 firescale train" in titan
    # Titan's aprun starts Cray MPICH, which reads no OMPI_MCA_* variable: only NCCL's is exported there.
    assert "export NCCL_ALGO=Tree" in titan and "OMPI_MCA_coll_tuned" not in titan
    slurm = render_job_script(load_site("ib-cluster"), fixed_job(8))
    assert "#SBATCH --nodes=2\n" in slurm and "#SBATCH --ntasks-per-node=4" in slurm
    assert "#SBATCH --signal=B:USR1@300" in slurm and "#SBATCH --partition=gpu" in slurm
    assert "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=10" in slurm
    # a site without a scheduler gets no directives at all; the same check finds them in the two above
    local = render_job_script(load_site("local"), fixed_job(2))
    directives = lambda script: [l for l in script.splitlines() if l.startswith(("#SBATCH", "#PBS"))]  # noqa: E731
    assert directives(local) == [] and local.startswith("#!/bin/bash\n")
    assert all(line.startswith("#PBS ") for line in directives(titan)) and len(directives(titan)) >= 4
    assert all(line.startswith("#SBATCH ") for line in directives(slurm)) and len(directives(slurm)) >= 4


def test_a_one_process_job_starts_its_command_once_in_an_allocation_for_all_ranks(tmp_path):
    """A calibration job: the scheduler allocates the ranks' nodes and tasks, and the command starts once, bare,
    on the first node (it starts its own steps there); after a failure every node is still asked for it."""
    job = JobSpec(**{**vars(fixed_job(8)), "one_process": True})
    slurm = render_job_script(load_site("ib-cluster"), job)
    assert "#SBATCH --nodes=2\n" in slurm and "#SBATCH --ntasks-per-node=4" in slurm
    launch = next(line for line in slurm.splitlines() if line.endswith(" &") and "train" in line)
    assert launch == "firescale train --net nin --out /shared/firescale/results/demo/g8 &"
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in slurm        # the program probe, one a node
    assert "# --- one process here; it starts its own steps on the allocation (8 rank(s), 2 node(s))" in slurm
    # Run here: a 2-rank job of the local site (mpirun) starts its command once, not once a rank.
    run = tmp_path / "run"
    code = "import os; open('started', 'a').write(os.environ.get('OMPI_COMM_WORLD_RANK', 'none') + '\\n')"
    two = JobSpec(name="once", ranks=2, walltime_s=60, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=[sys.executable, "-c", code])
    proc = _run_script(tmp_path, render_job_script(load_site("local"), JobSpec(**{**vars(two), "one_process": True})))
    assert proc.returncode == 0, proc.stderr
    assert (run / "started").read_text() == "none\n"
    assert _status(run)["ranks"] == 2 and _status(run)["exit_code"] == 0
    (run / "started").unlink()
    proc = _run_script(tmp_path, render_job_script(load_site("local"), two))     # as a point: once a rank
    assert proc.returncode == 0, proc.stderr
    assert sorted((run / "started").read_text().split()) == ["0", "1"]


def test_a_missing_template_value_is_an_error_not_an_empty_string(tmp_path):
    (tmp_path / "local.sh.j2").write_text("#!/bin/bash\necho {{ job.name }} {{ no_such_value }}\n")
    environment.cache_clear()
    with pytest.raises(FirescaleError, match="no_such_value"):
        render_job_script(load_site("local"), fixed_job(1), templates=tmp_path)


def test_a_profile_value_with_shell_syntax_stays_literal(tmp_path):
    evil = "x; touch PWNED; echo `id` $(id)"
    site = load_site(site_copy(tmp_path, "local", lambda d: d["environment"]["variables"].update(EVIL=evil)))
    run = tmp_path / "run"
    job = JobSpec(name="inject", ranks=1, walltime_s=60, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json",
                  command=[sys.executable, "-c", "import os; open('evil.txt', 'w').write(os.environ['EVIL'])"])
    script = render_job_script(site, job)
    assert "export EVIL='x; touch PWNED; echo `id` $(id)'" in script
    proc = _run_script(tmp_path, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run / "evil.txt").read_text() == evil
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("value,expected", [
    ("~/venvs/fs", "/home/ada/venvs/fs"),
    ("/scratch/${USER}/x y", "/scratch/ada/x y"),
    ("$USER-$(reboot)`id`;ls *", "ada-$(reboot)`id`;ls *"),
    ("a~/b", "a~/b"),
])
def test_only_home_and_variables_expand_in_paths(value, expected):
    word = quote_expanding(value)
    proc = subprocess.run(["bash", "-c", f"printf '%s' {word}"], capture_output=True, text=True,
                          env={"HOME": "/home/ada", "USER": "ada", "PATH": os.environ["PATH"]})
    assert proc.stdout == expected


def _local_job(tmp_path, code: str) -> tuple[str, Path]:
    run = tmp_path / "run"
    job = JobSpec(name="body", ranks=1, walltime_s=60, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=[sys.executable, "-c", code])
    return render_job_script(load_site("local"), job), run


def _run_script(tmp_path, script, **kw):
    path = tmp_path / "job.sh"
    path.write_text(script)
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=120, **kw)


def _status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


def test_the_job_writes_its_status_when_it_succeeds(tmp_path):
    script, run = _local_job(tmp_path, "import os; print('rank env', os.environ['FIRESCALE_ALLREDUCE'])")
    proc = _run_script(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    assert "rank env tree" in proc.stdout
    status = _status(run)
    assert status["exit_code"] == 0 and status["ranks"] == 1 and status["job_name"] == "body"
    host = os.uname().nodename
    assert status["hosts"] == [host.split(".")[0]] or status["hosts"][0].startswith(host[:8])
    assert status["start"] <= status["end"]
    assert not list(run.glob("status.json.tmp.*"))


def test_the_job_writes_its_status_when_it_fails(tmp_path):
    script, run = _local_job(tmp_path, "raise SystemExit(7)")
    proc = _run_script(tmp_path, script)
    assert proc.returncode != 0
    assert _status(run)["exit_code"] == proc.returncode


@pytest.mark.parametrize("sent", [signal.SIGUSR1, signal.SIGTERM])
def test_the_job_forwards_the_walltime_signal_to_the_ranks(tmp_path, sent):
    code = ("import signal, sys, time, pathlib\n"
            "signal.signal(signal.SIGUSR1,\n"
            "              lambda *a: (pathlib.Path('snapshot.txt').write_text('saved'), sys.exit(3)))\n"
            "pathlib.Path('ready').write_text('1')\n"
            "time.sleep(60)\n")
    script, run = _local_job(tmp_path, code)
    err = _signalled(tmp_path, script, run, sent)
    assert (run / "snapshot.txt").read_text() == "saved", err  # the rank got USR1 through mpirun
    status = _status(run)
    assert status["signal"] == sent.name.removeprefix("SIG") and status["exit_code"] == 3


@pytest.mark.parametrize("sent", [signal.SIGUSR2, signal.SIGTERM])
def test_a_usr2_site_forwards_usr2_to_the_ranks(tmp_path, sent):
    """Where the walltime signal is USR2 (NCCL's jobs take it by default), the ranks are sent USR2, also on a
    cancel's TERM, and status.json names the signal that came."""
    site = load_site(site_copy(tmp_path, "local", lambda d: d.update(
        walltime_signal={"signal": "USR2", "seconds_before": 300})))
    code = ("import signal, sys, time, pathlib\n"
            "signal.signal(signal.SIGUSR2,\n"
            "              lambda *a: (pathlib.Path('snapshot.txt').write_text('saved'), sys.exit(3)))\n"
            "pathlib.Path('ready').write_text('1')\n"
            "time.sleep(60)\n")
    run = tmp_path / "run"
    job = JobSpec(name="body", ranks=1, walltime_s=60, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=[sys.executable, "-c", code])
    err = _signalled(tmp_path, render_job_script(site, job), run, sent)
    assert (run / "snapshot.txt").read_text() == "saved", err
    assert "asking the ranks to snapshot and stop (SIGUSR2)" in err
    assert _status(run)["signal"] == sent.name.removeprefix("SIG") and _status(run)["exit_code"] == 3


def test_where_nccl_runs_the_job_sends_usr2_and_sets_the_collectives_timeouts():
    """A GPU site's PyTorch job: Slurm's walltime signal USR2, the ranks' too, NCCL's async error handling and the
    process group's timeout; its TensorFlow job keeps USR1 and sets Horovod's stall check instead."""
    site = load_site("ib-cluster")
    torch_job = render_job_script(site, dataclasses.replace(fixed_job(8), framework="pytorch"))
    assert "#SBATCH --signal=B:USR2@300\n" in torch_job and 'kill -s USR2 "$FIRESCALE_CHILD"' in torch_job
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n" in torch_job
    assert "export FIRESCALE_COLLECTIVE_TIMEOUT_S=600\n" in torch_job and "HOROVOD_STALL" not in torch_job
    tf_job = render_job_script(site, fixed_job(8))
    assert "#SBATCH --signal=B:USR1@300\n" in tf_job and "TORCH_NCCL" not in tf_job
    assert "export HOROVOD_STALL_CHECK_TIME_SECONDS=60\n" in tf_job
    assert "export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=600\n" in tf_job
    # a CPU site's PyTorch job: USR1, the timeout, no NCCL
    cpu = render_job_script(load_site("vcluster"), dataclasses.replace(fixed_job(2), framework="pytorch"))
    assert "--signal=B:USR1@60" in cpu and "FIRESCALE_COLLECTIVE_TIMEOUT_S=600" in cpu and "TORCH_NCCL" not in cpu


@pytest.mark.parametrize("sent", [signal.SIGUSR1, signal.SIGTERM])
def test_a_one_process_job_passes_the_walltime_signal_on_as_term(tmp_path, sent):
    """A calibration takes no snapshot: its one process is asked to stop with TERM (it then stops its ranks)."""
    code = ("import signal, sys, time, pathlib\n"
            "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path('stopped.txt').write_text('TERM'), sys.exit(4)))\n"
            "pathlib.Path('ready').write_text('1')\n"
            "time.sleep(60)\n")
    run = tmp_path / "run"
    job = JobSpec(name="calibration", ranks=2, walltime_s=60, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=[sys.executable, "-c", code], one_process=True)
    err = _signalled(tmp_path, render_job_script(load_site("local"), job), run, sent)
    assert (run / "stopped.txt").read_text() == "TERM", err
    assert "asking its one process to stop (SIGTERM)" in err and "snapshot" not in err
    assert _status(run)["exit_code"] == 4


def _signalled(tmp_path: Path, script: str, run: Path, sent: signal.Signals) -> str:
    """Start the job `script`, send it `sent` once its command wrote `ready`; its standard error."""
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.Popen(["bash", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (run / "ready").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert (run / "ready").exists(), "the job's command did not start"
    proc.send_signal(sent)
    return proc.communicate(timeout=60)[1]
