"""Allreduce cost models: the papers' equations and how they grow with p."""
from __future__ import annotations

import pytest

from firescale.errors import FirescaleError
from firescale.model.comm import COST_MODELS, Link, allreduce_time, fit_comm_ppp, tree_height

MB30 = 30e6
BW = 70e9 / 8  # 70 Gbit/s


def test_one_node_costs_nothing():
    for algo in COST_MODELS:
        assert allreduce_time(algo, MB30, 1, Link(BW, 1e-6)) == 0.0


def test_firecaffe_equations_3_and_4():
    link = Link(BW)
    for p in (2, 8, 32, 128):
        # Eq. 4: 2 log2(p) |W| / BW
        assert allreduce_time("tree", MB30, p, link) == pytest.approx(2 * tree_height(p) * MB30 / BW)
        # Eq. 3: p |W| / BW; `ps` is Paleo's OneToAll, 2 (p-1) |W| / BW (test_parameter_servers.py)
        assert allreduce_time("firecaffe-ps", MB30, p, link) == pytest.approx(p * MB30 / BW)
        assert allreduce_time("ps", MB30, p, link) == pytest.approx(2 * (p - 1) * MB30 / BW)
    assert tree_height(3) == 2 and tree_height(128) == 7


def test_parameter_server_grows_linearly_and_the_tree_logarithmically():
    link = Link(BW, 2e-6)
    ps = [allreduce_time("ps", MB30, p, link) for p in (2, 4, 8, 16)]
    tree = [allreduce_time("tree", MB30, p, link) for p in (2, 4, 8, 16)]
    assert ps[3] / ps[0] == pytest.approx(15, rel=0.01)
    assert tree[3] / tree[0] == pytest.approx(4, rel=0.01)
    # ring and Rabenseifner approach 2 |W| / BW for large p; butterfly sends the whole vector log2 p times
    assert allreduce_time("ring", MB30, 128, Link(BW)) == pytest.approx(2 * 127 / 128 * MB30 / BW)
    assert allreduce_time("rabenseifner", MB30, 128, Link(BW)) == pytest.approx(2 * 127 / 128 * MB30 / BW)
    assert allreduce_time("butterfly", MB30, 8, Link(BW)) == pytest.approx(3 * MB30 / BW)


def test_latency_reduction_and_percent_of_peak_terms():
    base = allreduce_time("ring", MB30, 4, Link(BW))
    assert allreduce_time("ring", MB30, 4, Link(BW, latency=1e-3)) == pytest.approx(base + 6e-3)
    assert allreduce_time("ring", MB30, 4, Link(BW, ppp=0.5)) == pytest.approx(2 * base)
    assert allreduce_time("ring", MB30, 4, Link(BW, reduce_rate=1e9)) == pytest.approx(base + 0.75 * MB30 / 1e9)


def test_fitting_the_communication_percent_of_peak_recovers_it():
    truth = Link(BW, latency=5e-6, ppp=0.56)
    measured = allreduce_time("tree", MB30, 8, truth)
    assert fit_comm_ppp("tree", MB30, 8, measured, Link(BW, latency=5e-6)) == pytest.approx(0.56, rel=1e-6)


def test_unknown_algorithm_lists_the_known_ones():
    with pytest.raises(FirescaleError, match="known: ps, firecaffe-ps, tree"):
        allreduce_time("hypercube", MB30, 4, Link(BW))


def test_the_binary_tree_receives_its_children_one_after_the_other():
    from firescale.model.comm import binary_tree_steps

    # p=4: rank 1's child 3 arrives while rank 0 takes rank 2's message; p=8 is a full tree of depth 2
    # plus one node below rank 3, so each of the root's two subtrees needs 2 steps before it is heard.
    assert [binary_tree_steps(p) for p in (1, 2, 3, 4, 5, 7, 8, 15, 16)] == [0, 1, 2, 2, 3, 4, 4, 6, 6]
    link = Link(BW, 1e-6)
    for p in (2, 4, 8, 64):
        assert allreduce_time("binary-tree", MB30, p, link) >= allreduce_time("tree", MB30, p, link)
    assert allreduce_time("binary", MB30, 7, Link(BW)) == pytest.approx(2 * 4 * MB30 / BW)


def test_a_librarys_own_choice_is_resolved_per_message_and_ranks():
    from firescale.model.comm import resolve_algorithm

    link = Link(BW, 2e-6)
    # Open MPI 4.1's fixed rules: 2 ranks, 100 kB -> segmented ring; 1 MB -> Rabenseifner; 200 ranks, 100 kB ->
    # a reduce then a broadcast (modelled as the binomial tree).
    assert resolve_algorithm("openmpi-default", 100e3, 2, link) == "ring"
    assert resolve_algorithm("openmpi-default", 1e6, 2, link) == "rabenseifner"
    assert resolve_algorithm("openmpi-default", 100e3, 200, link) == "tree"
    assert allreduce_time("openmpi-default", 1e6, 2, link) == allreduce_time("rabenseifner", 1e6, 2, link)
    assert resolve_algorithm("mpich-default", 2048, 64, link) == "butterfly"
    assert resolve_algorithm("mpich-default", 1e6, 64, link) == "rabenseifner"
    # NCCL runs the faster of its ring and tree: the tree for small messages over many ranks, the ring for large.
    assert resolve_algorithm("nccl-default", 1e3, 128, link) == "tree"
    assert resolve_algorithm("nccl-default", 1e8, 128, link) == "ring"
    for name in ("openmpi-default", "nccl-default", "mpich-default"):
        assert allreduce_time(name, MB30, 1, link) == 0.0


def test_default_alone_must_name_its_library():
    with pytest.raises(FirescaleError, match="openmpi-default, mpich-default, nccl-default"):
        allreduce_time("default", MB30, 4, Link(BW))


def test_fitting_a_librarys_choice_fits_the_algorithm_it_picked():
    truth = Link(BW, latency=5e-6, ppp=0.4)
    measured = allreduce_time("rabenseifner", 1e6, 2, truth)
    assert fit_comm_ppp("openmpi-default", 1e6, 2, measured, Link(BW, latency=5e-6)) == pytest.approx(0.4, rel=1e-6)
