"""The virtual multi-node Slurm cluster for the tests of this folder: up once per session, always torn down."""
from __future__ import annotations

import os

import pytest

from firescale.vcluster import VClusterError, VirtualCluster

# Namespaces of the test cluster are named fsvt-*, apart from a cluster a user started (fsvc-*).
TEST_CLUSTER = "fsvt"


@pytest.fixture(scope="session")
def vcluster(tmp_path_factory):
    """A running virtual cluster (FIRESCALE_VCLUSTER_NODES nodes, default 2); removed at the end of the
    session whatever the tests did."""
    nodes = int(os.environ.get("FIRESCALE_VCLUSTER_NODES", "2"))
    cluster = VirtualCluster(root=tmp_path_factory.mktemp("vcluster"), nodes=nodes, name=TEST_CLUSTER)
    try:
        cluster.up()
    except VClusterError as exc:
        pytest.fail(f"{exc}; this tier needs root, network namespaces and Slurm (`make setup` as root installs "
                    "Slurm); deselect it with -m 'not vcluster'")
    try:
        yield cluster
    finally:
        cluster.down()
