"""Every launcher a cluster uses, on two real (virtual) nodes: ranks on both hosts, Horovod's allreduce
crossing between them, and everything the job body set reaching the rank on the second node; the
submitting shell's relative PATH reaching them too, and a node that lacks the ranks' program named; ranks a
command starts from outside the cluster, through its client shims."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from firescale.cluster.ranks import site_ranks
from firescale.cluster.site import load_site
from firescale.jobs.render import render_job_script
from firescale.jobs.schedulers import get_scheduler, prefixed
from firescale.jobs.spec import JobSpec
from firescale.sweep.run import PointRun, Polling

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
pytestmark = pytest.mark.vcluster

# Each rank reports its host, what Horovod's allreduce gave across the nodes, and its environment.
RANK_CODE = """\
import json, os, socket, sys
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
total = hvd.allreduce(tf.fill([1 << 20], float(hvd.rank() + 1)), op=hvd.Sum)
names = ["FS_PROFILE_VAR", "FS_MODULE_VAR", "FS_JOB_VAR", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "FIRESCALE_ALLREDUCE",
         "OMP_NUM_THREADS", "FIRESCALE_JOB_NAME", "PATH"]
report = {"rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(), "sum": float(total[0]),
          "prefix": sys.prefix, "env": {n: os.environ.get(n) for n in names}}
with open(f"rank-{hvd.rank()}.json", "w") as fh:
    json.dump(report, fh)
if hvd.rank() == 0:
    json.dump({"status": "finished"}, open("result.json", "w"))
"""

# What `module load` would do: a variable of its own and a library path.
MODULE = "export FS_MODULE_VAR=loaded\nexport LD_LIBRARY_PATH=/opt/fs-module/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\n"


def _site(tmp_path: Path, cluster, launcher: str, **edits):
    data = yaml.safe_load((REPO / "site" / "vcluster" / "site.yaml").read_text())
    module = tmp_path / "module.sh"
    module.write_text(MODULE)
    data.update(name=f"vc-{launcher}", launcher=launcher, client_prefix=[str(cluster.enter), "ctl"],
                vcluster=str(cluster.root), limits={**data["limits"], "max_nodes": cluster.nodes})
    data["environment"] = {"variables": {**data["environment"]["variables"], "FS_PROFILE_VAR": "from the profile"},
                           "source": [str(module)], "venv": str(VENV)}
    data.update(edits)
    path = tmp_path / data["name"] / "site.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    return load_site(path)


def _run(tmp_path: Path, cluster, site, monkeypatch, ranks: int = 2, path: str = SYSTEM_PATH,
         command: tuple[str, ...] = ("python", "-c", RANK_CODE)):
    # By default the submitting shell knows nothing of the venv: only the job body's activation can put it there.
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    run = tmp_path / "run"
    job = JobSpec(name=f"fs-{site.launcher}", ranks=ranks, walltime_s=600, workdir=run, log_file=run / "job.log",
                  status_file=run / "status.json", command=list(command), env={"FS_JOB_VAR": "from the job"})
    script = tmp_path / "job.sh"
    script.write_text(render_job_script(site, job))
    lines: list[str] = []
    point_run = PointRun(scheduler=get_scheduler("slurm", prefixed(site.config["client_prefix"])), script=script,
                         run_dir=run, max_resubmits=0, log=lines.append,
                         polling=Polling(first=0.5, factor=1.5, most=2, status_wait=20))
    verdict, _ = point_run.run()
    log = (run / "job.log").read_text() if (run / "job.log").exists() else ""
    return verdict, run, "\n".join(lines) + "\n" + log


LAUNCHERS = {
    "srun": {},                      # srun --mpi=pmix, chosen by the profile
    "mpirun": {},                    # mpirun inside the allocation: Open MPI starts its daemons with srun
    # mpirun that reaches the other node as on a cluster without Slurm integration (PBS without tm):
    # through ssh, which carries nothing of the environment, so only what firescale lists arrives
    "mpirun-ssh": {"launcher": "mpirun"},
    # horovodrun insists on ssh to every host, also where mpirun then uses srun
    "horovodrun": {},
}


@pytest.mark.tensorflow
@pytest.mark.parametrize("variant", list(LAUNCHERS))
def test_ranks_on_both_nodes_get_everything_the_job_body_set(tmp_path, vcluster, monkeypatch, variant):
    launcher = LAUNCHERS[variant].get("launcher", variant)
    edits: dict = {}
    if variant == "mpirun-ssh":
        edits["launcher_options"] = ["--mca", "plm", "rsh", "--mca", "plm_rsh_agent", str(vcluster.ssh_bin / "ssh")]
    site = _site(tmp_path, vcluster, launcher, **edits)
    if variant == "horovodrun":
        site.config["environment"]["variables"]["PATH"] = f"{vcluster.ssh_bin}:${{PATH}}"  # the ssh stand-in
    verdict, run, log = _run(tmp_path, vcluster, site, monkeypatch)
    assert verdict.outcome == "succeeded", f"{verdict.reason}\n{log}"
    reports = [json.loads((run / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["host"] for r in reports] == ["n1", "n2"], reports          # rank 0 on n1, rank 1 on n2
    assert all(r["size"] == 2 and r["sum"] == 3.0 for r in reports)   # 1 + 2, summed across the nodes
    second = next(r for r in reports if r["host"] == "n2")
    env = second["env"]
    assert env["FS_PROFILE_VAR"] == "from the profile"                  # environment.variables
    assert env["FS_MODULE_VAR"] == "loaded"                             # environment.source (a module)
    assert env["LD_LIBRARY_PATH"].split(":")[0] == "/opt/fs-module/lib"
    assert env["FS_JOB_VAR"] == "from the job"                          # the job's own variables
    assert env["VIRTUAL_ENV"] == str(VENV) and second["prefix"] == str(VENV)   # the venv
    assert env["PATH"].split(":")[0] == str(VENV / "bin")
    assert env["FIRESCALE_ALLREDUCE"] == site.allreduce and env["OMP_NUM_THREADS"] == "1"
    assert env["FIRESCALE_JOB_NAME"] == f"fs-{launcher}"
    status = json.loads((run / "status.json").read_text())
    assert status["hosts"] == ["n1", "n2"] and status["exit_code"] == 0


def test_a_missing_srun_mpi_plugin_fails_the_point_with_one_sentence(tmp_path, vcluster, monkeypatch):
    site = _site(tmp_path, vcluster, "srun", srun_mpi="pmi9")
    verdict, run, log = _run(tmp_path, vcluster, site, monkeypatch)
    assert verdict.outcome == "failed", log
    status = json.loads((run / "status.json").read_text())
    assert status["exit_code"] == 78
    assert "no MPI plugin pmi9" in status["reason"] and "pmix" in status["reason"]
    assert "no MPI plugin pmi9" in verdict.reason
    assert not list(run.glob("rank-*.json"))


# Each task says where it ran and which python ran it (srun numbers the tasks; no MPI needed).
WHERE_CODE = """\
import json, os, socket, sys
report = {"host": socket.gethostname(), "python": sys.executable, "path": os.environ["PATH"]}
json.dump(report, open(f"rank-{os.environ['SLURM_PROCID']}.json", "w"))
if os.environ["SLURM_PROCID"] == "0":
    json.dump({"status": "finished"}, open("result.json", "w"))
"""


def test_a_relative_path_entry_of_the_submitting_shell_reaches_both_nodes(tmp_path, vcluster, monkeypatch):
    """The README's `PATH=.venv/bin:$PATH snakemake --profile vcluster ...`, where the site has `venv: null`
    (issue 23): the ranks start in their run folder, yet find the venv's python on both nodes."""
    site = _site(tmp_path, vcluster, "srun")
    site.config["environment"]["venv"] = None
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(VENV)
    monkeypatch.chdir(checkout)
    verdict, run, log = _run(tmp_path, vcluster, site, monkeypatch, path=f".venv/bin:{SYSTEM_PATH}",
                             command=("python", "-c", WHERE_CODE))  # this machine has no other `python`
    assert verdict.outcome == "succeeded", f"{verdict.reason}\n{log}"
    reports = [json.loads((run / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["host"] for r in reports] == ["n1", "n2"], reports
    assert all(r["python"] == f"{checkout}/.venv/bin/python" for r in reports), reports
    assert all(r["path"] == f"{checkout}/.venv/bin:{SYSTEM_PATH}" for r in reports), reports


@contextlib.contextmanager
def _hidden_on(cluster, node: str, folder: Path):
    """`folder` empty on `node` alone: an empty folder mounted over it in the mount namespace of the node's
    slurmd, which its job steps share (each virtual node has its own)."""
    empty = folder.parent / f"{folder.name}-empty"
    empty.mkdir()
    ns = ["nsenter", "-t", str(cluster.daemon_pids()[node]), "-m"]
    subprocess.run([*ns, "mount", "--bind", str(empty), str(folder)], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*ns, "umount", str(folder)], check=True, capture_output=True)


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_a_node_without_the_ranks_program_is_named_with_its_path(tmp_path, vcluster, monkeypatch, launcher):
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "firescale").symlink_to(VENV / "bin" / "firescale")
    site = _site(tmp_path, vcluster, launcher)
    site.config["environment"]["venv"] = None
    path = f"{tools}:{SYSTEM_PATH}"
    with _hidden_on(vcluster, "n2", tools):
        verdict, run, log = _run(tmp_path, vcluster, site, monkeypatch, path=path, command=("firescale", "--help"))
    status = json.loads((run / "status.json").read_text())
    assert verdict.outcome == "failed" and status["exit_code"] == 127, log
    assert status["reason"].startswith(f"firescale is not found on node n2, whose PATH is {path}; "), log
    assert verdict.reason.startswith("exit code 127 (status.json)"), verdict.reason
    assert verdict.reason.endswith(f": {status['reason']}"), verdict.reason  # not "the launcher lost rank 1"


def test_a_command_outside_the_cluster_starts_its_ranks_through_the_client_shims(tmp_path, vcluster, monkeypatch):
    """`bench knobs --site vcluster` and the other commands that start ranks here run the site's srun from a
    shell where Slurm's own srun finds no controller ("DNS SRV lookup failed"): the site's `vcluster:` folder
    puts the cluster's shims first on srun's PATH, and the ranks land on both nodes."""
    site = _site(tmp_path, vcluster, "srun")
    monkeypatch.setenv("PATH", f"{VENV / 'bin'}:{SYSTEM_PATH}")      # no shims: the shell as a user has it
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    out = site_ranks(site).run(2, [sys.executable, "-c", "import socket; print(socket.gethostname())"],
                               "the hostname check", timeout=120)
    assert sorted(out.split()) == ["n1", "n2"]
