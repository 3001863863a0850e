"""Two ranks a node (`vcluster up --cpus-per-node 2`): Slurm places two tasks on a node's one core, and the
copies `bench predict` runs for a node's contention land together on one node, each a process of its own,
and the calibration's copies across nodes land two on each."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from firescale.cluster.ranks import site_ranks
from firescale.cluster.site import load_site
from firescale.testing.vcluster import VirtualCluster

pytestmark = [pytest.mark.vcluster, pytest.mark.tensorflow]   # each copy starts Horovod

# Each copy reports where it ran and the Horovod world it found, into the path it was given last.
COPY = """\
import json, os, socket, sys
import horovod.tensorflow as hvd
hvd.init()
json.dump({"host": socket.gethostname(), "size": hvd.size(), "cores": sorted(os.sched_getaffinity(0))},
          open(sys.argv[-1], "w"))
"""


def test_two_cpus_a_node_restart_the_cluster_and_copies_share_one_node(tmp_path, monkeypatch):
    cluster = VirtualCluster(root=tmp_path / "vc", nodes=2, name=f"fsv2-{os.getpid()}")
    try:
        cluster.up()
        one_cpu = cluster.daemon_pids()
        doubled = VirtualCluster(root=cluster.root, nodes=2, name=cluster.name, cpus_per_node=2)
        doubled.up()         # up as laid out otherwise: restarted with the new slurm.conf, not left as it was
        assert doubled.is_up() and doubled.node_cpus() == {"n1": 2, "n2": 2}
        assert set(doubled.daemon_pids().values()).isdisjoint(one_cpu.values())

        monkeypatch.setenv("PATH", f"{doubled.bin}{os.pathsep}{os.environ['PATH']}")
        ranks = site_ranks(load_site("vcluster-2x2"))
        out = tmp_path / "copy"
        step = subprocess.run(ranks.copies_argv(2, [sys.executable, "-c", COPY, "--out"], out),
                              capture_output=True, text=True, timeout=300, env={**os.environ, **ranks.env})
        assert step.returncode == 0, step.stderr[-3000:]
        copies = [json.loads(out.with_name(f"copy-{i}").read_text()) for i in range(2)]
        # one node, its one core, and each copy a Horovod world of its own (no MPI between them)
        assert copies[0]["host"] == copies[1]["host"] in {"n1", "n2"}
        assert copies[0]["cores"] == copies[1]["cores"] and len(copies[0]["cores"]) == 1
        assert [c["size"] for c in copies] == [1, 1]
        # as many on each of both nodes at once (the calibration's contention across a 2 x 2 point's nodes)
        wide = tmp_path / "wide"
        step = subprocess.run(ranks.copies_argv(2, [sys.executable, "-c", COPY, "--out"], wide, nodes=2),
                              capture_output=True, text=True, timeout=300, env={**os.environ, **ranks.env})
        assert step.returncode == 0, step.stderr[-3000:]
        spread = [json.loads(wide.with_name(f"wide-{i}").read_text()) for i in range(4)]
        assert sorted(c["host"] for c in spread) == ["n1", "n1", "n2", "n2"] and {c["size"] for c in spread} == {1}
    finally:
        cluster.down()
    assert cluster.existing_namespaces() == []
