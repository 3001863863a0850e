"""`firescale vcluster link`: each node's sending shaped to a rate, measured by a real TCP transfer between nodes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from firescale.cli import main
from firescale.testing.namespaces import make_network
from firescale.testing.vcluster import VirtualCluster

pytestmark = pytest.mark.vcluster

MEGABYTES = 4
# The receiver times from the first byte to the last; the sender writes MEGABYTES and closes.
RECEIVE = """
import socket, sys, time
server = socket.create_server(("10.77.0.12", 5201))
print("listening", flush=True)
conn, _ = server.accept()
got, start = 0, None
while chunk := conn.recv(1 << 20):
    start = start or time.perf_counter()
    got += len(chunk)
print(got * 8 / (time.perf_counter() - start) / 1e9)
"""
SEND = f"""
import socket
with socket.create_connection(("10.77.0.12", 5201)) as conn:
    conn.sendall(bytes({MEGABYTES} << 20))
"""


def _gbits_n1_to_n2(cluster: VirtualCluster) -> float:
    """The rate at which n2 receives MEGABYTES sent by n1, in Gbit/s."""
    receiver = subprocess.Popen(["ip", "netns", "exec", cluster.namespace("n2"), sys.executable, "-c", RECEIVE],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "listening"
        subprocess.run(["ip", "netns", "exec", cluster.namespace("n1"), sys.executable, "-c", SEND], check=True,
                       timeout=60)
        out, _ = receiver.communicate(timeout=60)
    finally:
        receiver.kill()
    return float(out.strip())


def test_a_shaped_link_sends_at_its_rate_and_off_lifts_it(tmp_path, capsys):
    cluster = VirtualCluster(root=tmp_path / "vc", nodes=2, name=f"fsvk-{os.getpid()}")
    try:
        make_network(cluster)          # the network alone: no Slurm is needed to send between nodes
        assert cluster.link_rates() == {"n1": "unshaped", "n2": "unshaped"}
        free = _gbits_n1_to_n2(cluster)
        cluster.shape_links(0.2)
        assert cluster.link_rates() == {"n1": "200Mbit", "n2": "200Mbit"}
        shaped = _gbits_n1_to_n2(cluster)
        # the bucket's first 64 KiB go at once, the rest at the rate: within 15% of 0.2 Gbit/s
        assert 0.17 < shaped < 0.23, shaped
        assert free > 5 * shaped, (free, shaped)
        cluster.shape_links(None)
        assert cluster.link_rates() == {"n1": "unshaped", "n2": "unshaped"}
        assert _gbits_n1_to_n2(cluster) > 5 * shaped
    finally:
        cluster.down()
    assert cluster.existing_namespaces() == []


def test_link_refuses_bad_rates_and_a_cluster_that_is_not_up(tmp_path, capsys):
    root = str(tmp_path / "vc")
    for argv, said in ((["--gbits", "fast"], "--gbits 'fast' is not a number of Gbit/s or 'off'"),
                       (["--gbits", "0"], "a link of 0.0 Gbit/s asked for; give more than 0"),
                       ([], "give --gbits RATE"),
                       (["--gbits", "1"], "nodes n1, n2 are not up; run `firescale vcluster up` first")):
        assert main(["vcluster", "link", "--dir", root, "--name", f"fsvn-{os.getpid()}", *argv]) != 0
        assert said in capsys.readouterr().err
    assert main(["vcluster", "up", "--dir", root, "--gbits", "1"]) != 0
    assert "--gbits goes with `vcluster link` only" in capsys.readouterr().err
