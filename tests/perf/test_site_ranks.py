"""How `bench predict` and the probes start ranks as a site does: what a failed run reports, and the virtual
cluster reached through its client shims."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from firescale.cluster.site import load_site
from firescale.errors import FirescaleError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))
from site_helpers import one_link, site_copy  # noqa: E402


def test_a_failed_rank_is_quoted_by_its_own_error_not_the_launchers_notice():
    # mpirun closes a failed run with a framed notice ("the job to be terminated. The first process to do so
    # was: ..."); quoting its last lines hid the rank's traceback (seen when a training run of `bench predict`
    # failed).  The rank's own last lines are quoted.
    from firescale.cluster.ranks import site_ranks
    ranks = site_ranks(load_site("local"))
    script = "import sys; print('ValueError: no such solver key: momentum3', file=sys.stderr); sys.exit(1)"
    with pytest.raises(FirescaleError) as caught:
        ranks.run(1, [sys.executable, "-c", script], "the check")
    message = str(caught.value)
    assert "the check (1 ranks on site local) failed with exit code 1" in message
    assert "ValueError: no such solver key: momentum3" in message
    assert "Process name" not in message and "-----" not in message


def test_copies_on_a_node_are_one_srun_step_and_each_copy_names_its_own_out(tmp_path):
    # The step `bench predict` runs for a node's contention: the site's srun options less its MPI plugin, one
    # node, a task per copy; each task runs the script with the command and OUT as arguments, never spliced in.
    import subprocess

    from firescale.cluster.ranks import site_ranks
    ranks = site_ranks(load_site("vcluster-2x2"))
    out = tmp_path / "a dir; echo no" / "contention-b4"
    argv = ranks.copies_argv(2, ["prog", "--x", "1", "--out"], out)
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--mpi=none"]
    # as many on each of several nodes at once: one step, the copies numbered across them
    assert ranks.copies_argv(2, ["prog", "--out"], out, nodes=2)[:5] == [
        "srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--mpi=none"]
    assert not any(a.startswith("--mpi=pmix") for a in argv)
    script_at = argv.index("-c") + 1
    assert argv[script_at + 1:] == [str(out), "prog", "--x", "1", "--out"]
    # the task's script, run as srun would run it on the node (task 1 of step 7): its own out and its own log,
    # no step id left
    out.parent.mkdir()
    shown = "import os, sys; print(sys.argv[1:], os.environ.get('SLURM_STEP_ID'), os.environ.get('SLURM_STEPID'))"
    task = subprocess.run(["sh", "-c", argv[script_at], str(out), sys.executable, "-c", shown, "--out"],
                          capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "SLURM_PROCID": "1", "SLURM_STEP_ID": "7", "SLURM_STEPID": "7"})
    assert task.stdout == ""
    log = out.with_name("contention-b4-1.log").read_text()
    assert log.strip() == f"{['--out', str(out) + '-1']} None None"


def test_copies_on_a_node_need_srun():
    from firescale.cluster.ranks import site_ranks
    with pytest.raises(FirescaleError, match="site local: copies of a run on one of its nodes start through srun "
                                             "only, not mpirun"):
        site_ranks(load_site("local")).copies_argv(2, ["prog", "--out"], "/tmp/x")


def test_a_copy_that_outlives_its_timeout_is_asked_to_stop_before_it_is_killed():
    # srun cancels its step on SIGTERM; a killed srun cannot.  A process that exits on TERM exits by itself,
    # one that ignores it is killed after the grace.
    import subprocess
    import time

    from firescale.cluster.ranks import stop
    polite = subprocess.Popen(["sh", "-c", 'trap "exit 3" TERM; sleep 30 & wait'], text=True)
    time.sleep(0.3)
    stop(polite, grace_s=10)
    assert polite.returncode == 3
    stubborn = subprocess.Popen(["sh", "-c", 'trap "" TERM; sleep 30 & wait; sleep 30'], text=True)
    time.sleep(0.3)
    started = time.monotonic()
    stop(stubborn, grace_s=0.5)
    assert stubborn.returncode == -9 and time.monotonic() - started < 5


def test_a_launcher_in_a_session_of_its_own_is_stopped_with_all_it_started_here():
    # mpirun's ranks are its children: a rank that outlives the launcher would compute beside the next round.
    import subprocess

    from firescale.cluster.ranks import stop
    launcher = subprocess.Popen(["sh", "-c", 'trap "exit 3" TERM; sleep 60 & echo $!; wait'], text=True,
                                stdout=subprocess.PIPE, start_new_session=True)
    assert launcher.stdout is not None
    rank = int(launcher.stdout.readline())
    stop(launcher, grace_s=10)
    assert launcher.returncode == 3
    assert _gone(rank), f"the launcher's child {rank} still runs"


def _gone(pid: int) -> bool:
    """True once `pid` has ended (gone, or a zombie its new parent has not reaped yet)."""
    import time
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("site, one_link_only, ranks, expected", [
    ("vcluster-2x2", False, 4, 2),   # two nodes of two ranks, a shared-memory link inside them: probe one node too
    ("vcluster-2x2", False, 3, 2),   # the fullest node's two
    ("vcluster-2x2", False, 2, 0),   # one node: the probe over all ranks is the node's
    ("vcluster", False, 2, 0),       # one rank a node: no link inside a node to measure
    ("local", False, 2, 0),          # one machine
    ("ib-cluster", False, 16, 4),    # four GPUs a node joined by NVLink
    ("ib-cluster", True, 16, 0),     # the same without its intra_node link: one link for every hop
])
def test_one_nodes_ranks_are_probed_apart_only_where_a_link_inside_nodes_joins_several(site, one_link_only, ranks,
                                                                                       expected, tmp_path):
    from firescale.cluster.ranks import node_probe_ranks
    loaded = load_site(site_copy(tmp_path, site, one_link) if one_link_only else site)
    assert node_probe_ranks(loaded, ranks) == expected


def test_copies_share_a_node_as_a_job_step_only_where_the_site_starts_steps_through_srun(tmp_path):
    # calibrate and bench predict both place a node's contention copies by copies_step: a Slurm site whose
    # launcher is mpirun runs them on the job's first node (here), never into copies_argv's srun-only error.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))
    from site_helpers import site_copy

    from firescale.cluster.ranks import copies_step
    step = copies_step(load_site("vcluster-2x2"))
    assert step is not None and step.copies_argv(2, ["prog", "--out"], tmp_path / "c")[0] == "srun"
    assert copies_step(load_site("local")) is None          # no scheduler: this machine's cores
    assert copies_step(load_site("titan")) is None          # aprun: the job's first node
    slurm_mpirun = load_site(site_copy(tmp_path, "vcluster-2x2", lambda d: d.update(launcher="mpirun")))
    assert slurm_mpirun.scheduler == "slurm" and copies_step(slurm_mpirun) is None


# The virtual cluster's srun reaches its controller only through the client shims in its folder (`vcluster:`);
# srun from outside it, as `bench knobs --site vcluster` ran it, failed with "DNS SRV lookup failed".
OUTSIDE_SRUN = "#!/bin/sh\necho 'srun: error: fetch_config: DNS SRV lookup failed' >&2\nexit 1\n"
# A shim that leaves the launcher's options and runs the command here, saying it was the shim.
SHIM_SRUN = '#!/bin/sh\necho "through the shims"\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n'


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _up_cluster(root: Path, cpus_per_node: int = 1) -> None:
    """A virtual cluster's folder as `vcluster up` leaves it, but for its shims (a stand-in srun) and a live
    controller (this process's pid)."""
    from firescale.testing.host_files import vcluster_slurm_conf
    from firescale.testing.layout import ClusterLayout
    layout = ClusterLayout(root=root, cpus_per_node=cpus_per_node)
    _executable(layout.bin / "srun", SHIM_SRUN)
    layout.conf.write_text(vcluster_slurm_conf(layout))
    layout.pidfile("slurmctld", "ctl").write_text(f"{os.getpid()}\n")


def _outside_the_cluster(tmp_path: Path, monkeypatch) -> None:
    _executable(tmp_path / "outside" / "srun", OUTSIDE_SRUN)
    monkeypatch.setenv("PATH", f"{tmp_path / 'outside'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


@pytest.mark.parametrize("site", ["vcluster", "vcluster-2x2"])
def test_ranks_on_the_virtual_cluster_start_through_its_client_shims(site, tmp_path, monkeypatch):
    from firescale.cluster.ranks import site_ranks
    root = tmp_path / "vc"
    _up_cluster(root, cpus_per_node=2 if site == "vcluster-2x2" else 1)
    _outside_the_cluster(tmp_path, monkeypatch)
    ranks = site_ranks(load_site(site_copy(tmp_path, site, lambda d: d.update(vcluster=str(root)))))
    out = ranks.run(2, [sys.executable, "-c", "print('rank ran')"], "the check")
    assert out.splitlines() == ["through the shims", "rank ran"]
    assert ranks.environment()["PATH"] == f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}"
    # inside one of its jobs srun reaches the controller itself: PATH as it is, the cluster not asked
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert ranks.environment()["PATH"] == os.environ["PATH"]


def test_ranks_on_a_virtual_cluster_that_is_not_up_say_to_bring_it_up(tmp_path, monkeypatch):
    from firescale.cluster.ranks import site_ranks
    ranks = site_ranks(load_site("vcluster"))
    _outside_the_cluster(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)        # no .firescale-work/vcluster here
    with pytest.raises(FirescaleError) as caught:
        ranks.run(2, [sys.executable, "-c", "print('rank ran')"], "the check")
    assert str(caught.value) == ("site vcluster runs on the virtual cluster in .firescale-work/vcluster, which is "
                                 "not up; start it with `firescale vcluster up` (as root)")
    # its files left by a cluster since brought down: no live controller
    _up_cluster(tmp_path / ".firescale-work" / "vcluster")
    (tmp_path / ".firescale-work" / "vcluster" / "slurmctld.pid").unlink()
    with pytest.raises(FirescaleError, match=r"which is not up; start it with `firescale vcluster up` \(as root\)$"):
        ranks.environment()


def test_two_ranks_a_node_on_a_virtual_cluster_of_one_cpu_a_node_say_how_to_restart_it(tmp_path, monkeypatch):
    from firescale.cluster.ranks import site_ranks
    root = tmp_path / "vc"
    _up_cluster(root, cpus_per_node=1)
    _outside_the_cluster(tmp_path, monkeypatch)
    ranks = site_ranks(load_site(site_copy(tmp_path, "vcluster-2x2", lambda d: d.update(vcluster=str(root)))))
    with pytest.raises(FirescaleError) as caught:
        ranks.environment()
    assert str(caught.value) == (f"site vcluster-2x2 runs 2 ranks a node on the virtual cluster in {root}, whose node "
                                 f"n1 has 1 CPU(s); restart it with `firescale vcluster up --dir {root} "
                                 "--cpus-per-node 2` (as root)")


def test_only_a_slurm_site_names_a_virtual_cluster(tmp_path):
    from firescale.cluster.site import check_site
    _, _, errors = check_site(site_copy(tmp_path, "local", lambda d: d.update(vcluster="./vc")))
    assert errors == [f"{tmp_path / 'local' / 'site.yaml'}: key 'vcluster': the virtual cluster runs Slurm, "
                      "this site uses 'local'"]
