"""The allreduce vocabulary against Open MPI itself: ompi_info's enums, its reading of our variables, what runs."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from site_helpers import site_copy

from firescale.cluster.collectives import (
    OMPI_ENUMS,
    SITE_ALGORITHMS,
    TREE_SHAPES,
    AllreduceChoice,
    decode_allreduce,
    openmpi_default_allreduce,
    site_allreduce,
)
from firescale.cluster.site import load_site
from mpitools import mpirun_argv

# What each site choice means, per collective, in ompi_info's words (written out here, not taken from the module).
INTENDED = {
    ("tree", "binomial"): {"allreduce": "nonoverlapping", "reduce": "binomial", "bcast": "binomial"},
    ("tree", "binary"): {"allreduce": "nonoverlapping", "reduce": "binary", "bcast": "binary_tree"},
    ("ring", "binomial"): {"allreduce": "ring"},
}


def ompi_info(env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["ompi_info", "--param", "coll", "tuned", "--level", "9"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def valid_values(text: str) -> dict[str, dict[int, str]]:
    """{collective: {number: name}} from the "Valid values" line under each coll_tuned_<c>_algorithm."""
    out: dict[str, dict[int, str]] = {}
    current = None
    for line in text.splitlines():
        match = re.search(r'parameter "coll_tuned_(\w+)_algorithm"', line)
        if match:
            current = match.group(1)
        elif "Valid values:" in line and current:
            out[current] = {int(n): name for n, name in re.findall(r'(\d+):"([^"]+)"', line)}
            current = None
    return out


def current_values(text: str) -> dict[str, tuple[str, str]]:
    """{parameter: (current value, data source)} for every coll_tuned parameter ompi_info lists."""
    return {m.group(1): (m.group(2), m.group(3)) for m in
            re.finditer(r'parameter "(coll_tuned_\w+)" \(current value: "([^"]*)", data source: ([\w ]+?),', text)}


def test_the_site_schema_allows_exactly_the_vocabulary():
    from firescale.cluster.site import site_schema

    allreduce = site_schema()["properties"]["allreduce"]["properties"]
    assert tuple(allreduce["algorithm"]["enum"]) == SITE_ALGORITHMS and tuple(allreduce["tree"]["enum"]) == TREE_SHAPES


def test_our_enum_tables_are_ompi_infos():
    enums = valid_values(ompi_info())
    for collective in ("allreduce", "reduce", "bcast"):
        assert enums[collective] == OMPI_ENUMS[collective], collective


@pytest.mark.parametrize("algorithm,tree", sorted(INTENDED))
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_every_value_we_set_is_the_intended_algorithm(algorithm, tree, device):
    env = AllreduceChoice(algorithm, tree, device, "openmpi").environment()
    enums = valid_values(ompi_info())
    set_here = {k.removeprefix("OMPI_MCA_coll_tuned_").removesuffix("_algorithm"): int(v)
                for k, v in env.items() if k.endswith("_algorithm") and k.startswith("OMPI_MCA_coll_tuned_")}
    assert {c: enums[c][n] for c, n in set_here.items()} == INTENDED[(algorithm, tree)]
    # Open MPI itself reads each variable as that algorithm, from the environment, with dynamic rules on.
    read = current_values(ompi_info(env))
    assert read["coll_tuned_use_dynamic_rules"] == ("true", "environment")
    for collective, name in INTENDED[(algorithm, tree)].items():
        assert read[f"coll_tuned_{collective}_algorithm"] == (name, "environment")
    assert env.get("NCCL_ALGO") == ({"tree": "Tree", "ring": "Ring"}[algorithm] if device == "gpu" else None)


def test_the_binomial_tree_is_no_longer_an_in_order_binary_reduce():
    env = AllreduceChoice("tree", "binomial", "cpu", "openmpi").environment()
    assert env["OMPI_MCA_coll_tuned_reduce_algorithm"] == "5" and env["OMPI_MCA_coll_tuned_bcast_algorithm"] == "6"


def test_default_sets_nothing_and_cray_mpich_gets_no_open_mpi_variables():
    assert AllreduceChoice("default", "binomial", "gpu", "openmpi").environment() == {"FIRESCALE_ALLREDUCE": "default"}
    titan = site_allreduce(load_site("titan")).environment()
    assert titan == {"FIRESCALE_ALLREDUCE": "tree", "FIRESCALE_ALLREDUCE_TREE": "binomial", "NCCL_ALGO": "Tree"}


# ------------------------------------------------------------------ what Open MPI runs, seen in the sums' bits

# Each rank sums float32 numbers of widely varying magnitude: floating-point addition is not associative, so
# the order a reduction algorithm adds them in shows in the bits of the result.
ORDERED_SUM = """
import hashlib, sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
digests = []
for nbytes in map(int, sys.argv[1:]):
    rng = np.random.default_rng(comm.rank)
    send = (rng.standard_normal(nbytes // 4) * 10.0 ** rng.integers(-6, 7, nbytes // 4)).astype(np.float32)
    recv = np.empty_like(send)
    comm.Allreduce(send, recv, op=MPI.SUM)
    digests.append(hashlib.sha256(recv.tobytes()).hexdigest())
if comm.rank == 0:
    print(" ".join(digests))
"""


def sums(tmp_path, ranks: int, env: dict[str, str], sizes: list[int]) -> list[str]:
    script = tmp_path / "ordered_sum.py"
    script.write_text(ORDERED_SUM)
    tuned = {k: v for k, v in env.items() if k.startswith("OMPI_MCA_")}
    proc = subprocess.run(mpirun_argv(ranks, [sys.executable, str(script), *map(str, sizes)], tuned),
                          capture_output=True, text=True, timeout=120, env={**os.environ, **tuned})
    assert proc.returncode == 0 and "invalid value" not in proc.stderr.lower(), proc.stderr[-2000:]
    return proc.stdout.split()


def by_name(names: dict[str, str]) -> dict[str, str]:
    return {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
            **{f"OMPI_MCA_coll_tuned_{c}_algorithm": name for c, name in names.items()}}


@pytest.mark.mpi
def test_the_numbers_we_set_run_the_algorithms_open_mpi_names(tmp_path):
    """Four ranks: our variables sum in the same order as Open MPI's own names for the intended algorithms,
    and the binomial tree, the binary tree and the ring each sum in an order of their own."""
    runs = {}
    for key, names in INTENDED.items():
        ours = sums(tmp_path, 4, AllreduceChoice(*key, "cpu", "openmpi").environment(), [16384])
        assert ours == sums(tmp_path, 4, by_name(names), [16384]), key
        runs[key] = ours[0]
    assert len(set(runs.values())) == 3


@pytest.mark.mpi
def test_default_is_what_open_mpis_fixed_rules_pick(tmp_path):
    """Three ranks, messages whose fixed-rule choices differ: with no setting, Open MPI sums exactly as
    the algorithm openmpi_default_allreduce names for that size, and unlike another algorithm."""
    sizes = [6000, 10000, 400000]
    picked = [openmpi_default_allreduce(3, n) for n in sizes]
    assert picked == ["ring", "recursive_doubling", "rabenseifner"]
    default = sums(tmp_path, 3, {}, sizes)
    forced = {name: sums(tmp_path, 3, by_name({"allreduce": name}), sizes) for name in set(picked) | {"ring"}}
    for i, name in enumerate(picked):
        assert default[i] == forced[name][i], (sizes[i], name)
        other = "recursive_doubling" if name == "ring" else "ring"
        assert default[i] != forced[other][i], (sizes[i], other)


# ------------------------------------------------------------------ the decision table, the decoding, the lint

@pytest.mark.parametrize("ranks,nbytes,expected", [
    (2, 4, "ring"), (2, 8, "recursive_doubling"), (2, 4095, "recursive_doubling"), (2, 4096, "ring"),
    (2, 100_000, "segmented_ring"), (2, 262_144, "rabenseifner"), (3, 1_000_000, "rabenseifner"),
    (4, 15, "ring"), (4, 8191, "recursive_doubling"), (8, 8192, "rabenseifner"), (16, 63, "segmented_ring"),
    (32, 127, "segmented_ring"), (64, 200_000, "recursive_doubling"), (128, 100_000, "nonoverlapping"),
    (256, 4095, "nonoverlapping"), (512, 10_000, "recursive_doubling"), (2048, 3000, "segmented_ring"),
    (4096, 20_000, "recursive_doubling"), (8192, 40_000, "rabenseifner"),
])
def test_open_mpi_fixed_rules(ranks, nbytes, expected):
    assert openmpi_default_allreduce(ranks, nbytes) == expected


CHOICES = [AllreduceChoice(a, t, d, m) for a in ("tree", "ring", "default") for t in ("binomial", "binary")
           for d in ("cpu", "gpu") for m in ("openmpi", "cray-mpich")]


@pytest.mark.parametrize("choice", CHOICES, ids=lambda c: f"{c.algorithm}-{c.tree}-{c.device_kind}-{c.mpi}")
def test_what_a_job_sets_decodes_to_the_model_the_prediction_uses(choice):
    """One vocabulary: the job's variables, read back as a run reads them, name the model predict uses."""
    from firescale.model.comm import COST_MODELS, Link, resolve_algorithm

    library = {"nccl": "nccl", "openmpi": "openmpi", "cray-mpich": "mpich"}[choice.gradient_library]
    nbytes, ranks, link = 4_000_000, 16, Link(12.5e9, 1e-6)
    used = decode_allreduce(choice.environment(), ranks=ranks, library=library, message_bytes=nbytes)
    # A run resolves Open MPI's and MPICH's own choices itself; NCCL's it records as NCCL's (nccl-default).
    assert resolve_algorithm(used.model, nbytes, ranks, link) == resolve_algorithm(choice.model, nbytes, ranks, link)
    if choice.model in ("openmpi-default", "mpich-default"):
        assert used.model in COST_MODELS
    else:
        assert used.model == choice.model
    assert decode_allreduce(choice.environment(), ranks=ranks, library=library).model == choice.model


def test_decoding_reads_names_too_and_ignores_what_open_mpi_ignores():
    names = by_name({"allreduce": "nonoverlapping", "reduce": "binary", "bcast": "binary_tree"})
    used = decode_allreduce(names, ranks=4, library="openmpi")
    assert used.model == "binary-tree" and used.tree and "reduce binary, bcast binary_tree" in used.algorithm
    off = {**names, "OMPI_MCA_coll_tuned_use_dynamic_rules": "0"}
    assert decode_allreduce(off, ranks=4, library="openmpi", message_bytes=1_000_000).model == "rabenseifner"
    bad = by_name({"allreduce": "11"})
    assert decode_allreduce(bad, ranks=4, library="openmpi").model == "openmpi-default"
    assert decode_allreduce({}, ranks=1, library="openmpi").model is None
    assert decode_allreduce({"NCCL_ALGO": "ring"}, ranks=8, library="nccl").model == "ring"
    assert decode_allreduce({}, ranks=8, library="gloo").algorithm == "gloo ring"


def test_lint_warns_where_the_allreduce_cannot_be_enforced(tmp_path):
    assert site_allreduce(load_site("ib-cluster")).warnings() == []
    assert site_allreduce(load_site("local")).warnings() == []
    titan = site_allreduce(load_site("titan")).warnings()
    assert len(titan) == 1 and "Cray MPICH" in titan[0] and "NCCL_ALGO=Tree" in titan[0]
    cpu = load_site(site_copy(tmp_path, "titan", lambda d: d["device"].update(kind="cpu")))
    (warning,) = site_allreduce(cpu).warnings()
    assert "cannot be enforced" in warning and site_allreduce(cpu).model == "mpich-default"
    binary = load_site(site_copy(tmp_path, "ib-cluster", lambda d: d["allreduce"].update(tree="binary")))
    assert "NCCL sums the GPU gradients down its own tree" in site_allreduce(binary).warnings()[0]
    proc = subprocess.run([sys.executable, "-m", "firescale", "site", "lint", "titan"], capture_output=True, text=True)
    assert proc.returncode == 0 and "warning: " in proc.stdout and "Cray MPICH" in proc.stdout
