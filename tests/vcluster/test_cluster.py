"""The virtual cluster itself: idempotent bring-up, nothing in the root namespace, complete tear-down."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from firescale.testing.namespaces import processes_in
from firescale.testing.vcluster import VirtualCluster, remove_abandoned_clusters

pytestmark = pytest.mark.vcluster


def _root_addresses() -> str:
    return subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout


def test_up_is_idempotent_and_down_removes_everything(tmp_path):
    cluster = VirtualCluster(root=tmp_path / "vc", nodes=1, name=f"fsvl-{os.getpid()}")
    try:
        cluster.up()
        pids = cluster.daemon_pids()
        assert cluster.is_up() and cluster.node_states() == {"n1": "idle"}
        cluster.up()  # already up: the same daemons, nothing restarted
        assert cluster.daemon_pids() == pids
        # the cluster's addresses exist only inside its namespaces
        assert "10.77." not in _root_addresses()
        inside = subprocess.run([str(cluster.enter), "n1", "ip", "-o", "-4", "addr", "show", "eth0"],
                                capture_output=True, text=True, check=True).stdout
        assert "10.77.0.11/24" in inside
        host = subprocess.run([str(cluster.enter), "n1", "hostname"], capture_output=True, text=True, check=True)
        assert host.stdout.strip() == "n1"
    finally:
        cluster.down()
    assert cluster.existing_namespaces() == []
    assert not cluster.cpusets.exists()
    assert all(not os.path.exists(p) for p in cluster.root.glob("*.pid"))
    cluster.down()  # a second tear-down is harmless


def test_half_started_cluster_is_restarted_cleanly(tmp_path):
    cluster = VirtualCluster(root=tmp_path / "vc", nodes=1, name=f"fsvl-{os.getpid()}")
    try:
        cluster.up()
        pid = cluster.daemon_pids()["n1"]
        os.kill(pid, 9)  # a node's slurmd dies
        deadline = time.monotonic() + 5
        while cluster.daemon_pids()["n1"] == pid and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cluster.is_up()
        cluster.up()
        assert cluster.is_up()
    finally:
        cluster.down()
    assert processes_in([f"fsvl-{os.getpid()}-{h}" for h in ("ctl", "n1")]) == []


def test_a_cluster_left_by_a_killed_test_session_is_removed(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()                                   # a pid that no longer runs, as a killed session's
    cluster = VirtualCluster(root=tmp_path / "old", nodes=1, name=f"fsvt-{gone.pid}")
    try:
        cluster.up()
        remove_abandoned_clusters("fsvt-", tmp_path)
        assert cluster.existing_namespaces() == [] and not cluster.cpusets.exists()
    finally:
        cluster.down()


def test_a_machine_without_network_namespaces_gets_one_sentence():
    """In a user namespace we are root by name, but `ip netns add` cannot work: the check says so."""
    code = "from firescale.testing.vcluster import check_machine\ncheck_machine()"
    proc = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-c", code],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "cannot create network namespaces" in proc.stderr and "ip netns add" in proc.stderr


def test_node_count_outside_range_is_refused(tmp_path):
    with pytest.raises(Exception, match="choose 1 to 200"):
        VirtualCluster(root=tmp_path, nodes=0)
