"""How a site's allreduce choice (tree, ring, default) becomes MPI and NCCL settings."""
from __future__ import annotations

# Open MPI's tuned collectives number their algorithms (ompi_info --param coll tuned --level 9):
#   allreduce: 2 = nonoverlapping (a reduce followed by a broadcast), 4 = ring
#   reduce:    5 = binary tree, 6 = binomial tree
#   bcast:     5 = binary tree, 6 = binomial tree
_OMPI_TREE = {"binomial": "6", "binary": "5"}
_OMPI_ALLREDUCE_RING = "4"
_OMPI_ALLREDUCE_REDUCE_BCAST = "2"

ALGORITHMS = ("tree", "ring", "default")


def allreduce_environment(algorithm: str, device_kind: str = "gpu", tree: str = "binomial") -> dict[str, str]:
    """Environment variables that make MPI (CPU tensors) and NCCL (GPU tensors) use `algorithm`.

    `default` leaves the libraries to choose and only records the choice.  The variables are read
    at MPI_Init / NCCL communicator creation, so the job script exports them before launching.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"allreduce algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    if tree not in _OMPI_TREE:
        raise ValueError(f"tree shape {tree!r}; known: {', '.join(_OMPI_TREE)}")
    env = {"FIRESCALE_ALLREDUCE": algorithm}
    if algorithm == "default":
        return env
    env["OMPI_MCA_coll_tuned_use_dynamic_rules"] = "1"
    if algorithm == "tree":
        env["FIRESCALE_ALLREDUCE_TREE"] = tree
        env["OMPI_MCA_coll_tuned_allreduce_algorithm"] = _OMPI_ALLREDUCE_REDUCE_BCAST
        env["OMPI_MCA_coll_tuned_reduce_algorithm"] = _OMPI_TREE[tree]
        env["OMPI_MCA_coll_tuned_bcast_algorithm"] = _OMPI_TREE[tree]
    else:
        env["OMPI_MCA_coll_tuned_allreduce_algorithm"] = _OMPI_ALLREDUCE_RING
    if device_kind == "gpu":
        env["NCCL_ALGO"] = "Tree" if algorithm == "tree" else "Ring"
    return env
