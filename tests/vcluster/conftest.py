"""The virtual multi-node Slurm cluster for the tests of this folder: up once per session, always torn down."""
from __future__ import annotations

import os

import pytest

from firescale.testing.vcluster import VClusterError, VirtualCluster, remove_abandoned_clusters

# Each test session has its own cluster, fsvt-<pid>-*, apart from a user's (fsvc-*) and from other sessions.
TEST_PREFIX = "fsvt-"


@pytest.fixture(scope="session")
def vcluster(tmp_path_factory):
    """A running virtual cluster (FIRESCALE_VCLUSTER_NODES nodes, default 2); removed at the end of the
    session whatever the tests did."""
    nodes = int(os.environ.get("FIRESCALE_VCLUSTER_NODES", "2"))
    root = tmp_path_factory.mktemp("vcluster")
    cluster = VirtualCluster(root=root, nodes=nodes, name=f"{TEST_PREFIX}{os.getpid()}")
    try:
        remove_abandoned_clusters(TEST_PREFIX, root)
        cluster.up()
    except VClusterError as exc:
        pytest.fail(f"{exc}; this tier needs root, network namespaces and Slurm (`make setup` as root installs "
                    "Slurm); deselect it with -m 'not vcluster'")
    try:
        yield cluster
    finally:
        cluster.down()
