"""Allreduce cost models (parameter servers, binomial and binary trees, butterfly, ring, Rabenseifner), α-β-γ."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from firescale.cluster.collectives import (
    DEFAULT_MODELS,
    OMPI_ALLREDUCE_MODEL,
    mpich_default_allreduce,
    openmpi_default_allreduce,
)
from firescale.errors import FirescaleError

COST_MODELS = ("ps", "firecaffe-ps", "tree", "binary-tree", "butterfly", "ring", "rabenseifner")
ALGORITHM_NAMES = {
    "ps": "parameter server, one message at a time (Paleo's OneToAll, 2(p-1)|W|/BW)",
    "firecaffe-ps": "parameter server, sends beside receives (FireCaffe Eq. 3, p|W|/BW)",
    "tree": "binomial reduction tree (reduce + broadcast; FireCaffe Eq. 4)",
    "binary-tree": "binary reduction tree (reduce + broadcast, two children per node)",
    "butterfly": "butterfly / recursive doubling",
    "ring": "ring (reduce-scatter + allgather)",
    "rabenseifner": "Rabenseifner (recursive halving + doubling)",
    "openmpi-default": "Open MPI 4.1's fixed rules, per message size and rank count",
    "mpich-default": "MPICH's rules (recursive doubling, or Rabenseifner for long messages)",
    "nccl-default": "NCCL's choice: the faster of its ring and tree",
}
LIBRARY_DEFAULTS = tuple(DEFAULT_MODELS.values())
# `ps` and `parameter_server` have always meant Paleo's OneToAll, which is also what Open MPI's basic_linear
# allreduce and `bench allreduce`'s ps run; FireCaffe's Eq. 3 has its own name.
_ALIASES = {"parameter_server": "ps", "onetoall": "ps", "one_to_all": "ps", "firecaffe_eq3": "firecaffe-ps",
            "binomial": "tree", "binomial_tree": "tree",
            "binary": "binary-tree", "binary_tree": "binary-tree", "recursive_doubling": "butterfly"}


@dataclass(frozen=True)
class Link:
    """One interconnect link: latency α (s), bandwidth (bytes/s) and the share of it a platform reaches.

    `ppp` is the communication platform percent of peak (Paleo 3.3): the bandwidth term is divided by
    it.  `reduce_rate` is the rate (bytes/s) at which a node sums incoming gradients; None means the
    reduction is free (Paleo and FireCaffe neglect it).
    """

    bandwidth: float
    latency: float = 0.0
    ppp: float = 1.0
    reduce_rate: float | None = None

    def __post_init__(self) -> None:
        if self.bandwidth <= 0 or not (0 < self.ppp <= 1.0) or self.latency < 0:
            raise FirescaleError(f"link needs bandwidth > 0, latency >= 0 and 0 < ppp <= 1, got "
                                 f"bandwidth={self.bandwidth}, latency={self.latency}, ppp={self.ppp}")

    @property
    def alpha(self) -> float:
        return self.latency

    @property
    def beta(self) -> float:
        """Seconds per byte on the link at the platform's percent of peak."""
        return 1.0 / (self.bandwidth * self.ppp)

    @property
    def gamma(self) -> float:
        """Seconds per byte to reduce (sum) received data."""
        return 0.0 if not self.reduce_rate else 1.0 / self.reduce_rate


def canonical_algorithm(name: str) -> str:
    """The model's name for `name`: one of COST_MODELS or a library's own choice (LIBRARY_DEFAULTS)."""
    key = name.lower().replace("_", "-")
    key = _ALIASES.get(key.replace("-", "_"), key)
    if key == "default":
        raise FirescaleError(f"allreduce 'default' is the library's own choice; name the library: "
                             f"{', '.join(LIBRARY_DEFAULTS)} (a site's 'default' names its own)")
    if key not in COST_MODELS + LIBRARY_DEFAULTS:
        known = ", ".join(COST_MODELS + LIBRARY_DEFAULTS)
        raise FirescaleError(f"unknown allreduce algorithm {name!r}; known: {known}")
    return key


def resolve_algorithm(name: str, nbytes: float, p: int, link: Link) -> str:
    """The model of what runs for one allreduce of `nbytes` over `p` nodes: a library's own choice
    (openmpi-default, mpich-default, nccl-default) resolved as that library decides; others as they are."""
    key = canonical_algorithm(name)
    if key == "openmpi-default":
        return OMPI_ALLREDUCE_MODEL[openmpi_default_allreduce(p, nbytes)]
    if key == "mpich-default":
        return OMPI_ALLREDUCE_MODEL[mpich_default_allreduce(p, nbytes)]
    if key == "nccl-default":
        # NCCL predicts each algorithm's time from its own latency and bandwidth tables and runs the
        # fastest; the site profile has no such tables, so the ring and tree models stand in for them.
        return min(("ring", "tree"), key=lambda a: _MODELS[a](float(nbytes), int(p), link))
    return key


def tree_height(p: int) -> int:
    """Depth of a binomial tree over p nodes: ceil(log2 p)."""
    return 0 if p <= 1 else math.ceil(math.log2(p))


def parameter_server_time(nbytes: float, p: int, link: Link) -> float:
    """Paleo's OneToAll: one of the p nodes gathers the other p-1 gradients one at a time, sums them,
    and sends the sum back to each in turn; with α = γ = 0, 2(p-1)·n/BW.  This is `ps`."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * (link.alpha + nbytes * link.beta) + (p - 1) * nbytes * link.gamma


def firecaffe_parameter_server_time(nbytes: float, p: int, link: Link) -> float:
    """FireCaffe's Eq. 3: a server that sends and receives at BW at once moves p workers' gradients,
    p·n/BW with α = γ = 0.  This is `firecaffe-ps`.

    FireCaffe calls it the minimum: its p counts every worker's gradient crossing the server's link, and
    sends are taken to overlap receives, which a synchronous server, sending the sum only once it has
    every gradient, does not do.  One rank needs no server and costs nothing, as in every model here.
    """
    if p <= 1:
        return 0.0
    return p * (link.alpha + nbytes * link.beta) + (p - 1) * nbytes * link.gamma


def tree_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Binomial reduction to a root in ceil(log2 p) steps, then broadcast down the same tree (Eq. 4)."""
    h = tree_height(p)
    return 2 * h * (link.alpha + nbytes * link.beta) + h * nbytes * link.gamma


@cache
def binary_tree_steps(p: int) -> int:
    """Message times on the critical path of a reduce down a binary tree over p nodes (children of node
    i are 2i+1 and 2i+2) when each node receives its children's messages one after the other."""
    def done(node: int) -> int:
        t = 0
        for ready in sorted(done(c) for c in (2 * node + 1, 2 * node + 2) if c < p):
            t = max(t, ready) + 1
        return t
    return done(0) if p > 1 else 0


def binary_tree_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Reduce up a binary tree, then broadcast down it (a parent sends to its two children in turn)."""
    steps = binary_tree_steps(p)
    return 2 * steps * (link.alpha + nbytes * link.beta) + steps * nbytes * link.gamma


def butterfly_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Recursive doubling: log2 p exchange-and-sum steps of the whole vector."""
    h = tree_height(p)
    return h * (link.alpha + nbytes * link.beta + nbytes * link.gamma)


def ring_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Ring: p-1 reduce-scatter and p-1 allgather steps of n/p bytes each."""
    if p <= 1:
        return 0.0
    frac = (p - 1) / p
    return 2 * (p - 1) * link.alpha + 2 * frac * nbytes * link.beta + frac * nbytes * link.gamma


def rabenseifner_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Reduce-scatter by recursive halving, allgather by recursive doubling."""
    if p <= 1:
        return 0.0
    frac = (p - 1) / p
    return 2 * tree_height(p) * link.alpha + 2 * frac * nbytes * link.beta + frac * nbytes * link.gamma


_MODELS = {
    "ps": parameter_server_time,
    "firecaffe-ps": firecaffe_parameter_server_time,
    "tree": tree_allreduce_time,
    "binary-tree": binary_tree_allreduce_time,
    "butterfly": butterfly_allreduce_time,
    "ring": ring_allreduce_time,
    "rabenseifner": rabenseifner_allreduce_time,
}


def allreduce_time(algorithm: str, nbytes: float, p: int, link: Link) -> float:
    """Seconds to allreduce `nbytes` over `p` nodes with the named algorithm."""
    if p < 1:
        raise FirescaleError(f"the number of nodes must be at least 1, not {p}")
    return _MODELS[resolve_algorithm(algorithm, nbytes, p, link)](float(nbytes), int(p), link)


def fit_comm_ppp(algorithm: str, nbytes: float, p: int, measured_seconds: float, link: Link) -> float:
    """The communication percent of peak that makes the model give the measured allreduce time.

    The latency and reduction terms are kept; the bandwidth term absorbs the rest.
    """
    if p <= 1:
        raise FirescaleError("fitting a communication percent of peak needs an allreduce over at least 2 ranks")
    algorithm = resolve_algorithm(algorithm, nbytes, p, link)   # fit the model of what ran, not a re-choice
    ideal = Link(link.bandwidth, link.latency, 1.0, link.reduce_rate)
    fixed = allreduce_time(algorithm, 0.0, p, ideal)   # latency terms only
    fixed += allreduce_time(algorithm, nbytes, p, Link(link.bandwidth * 1e12, 0.0, 1.0, link.reduce_rate))
    bandwidth_part = allreduce_time(algorithm, nbytes, p, Link(link.bandwidth, 0.0, 1.0, None))
    spare = measured_seconds - fixed
    if spare <= 0:
        raise FirescaleError(f"the measured allreduce time {measured_seconds:.3g} s is below the model's "
                             f"latency and reduction terms ({fixed:.3g} s); lower the link latency")
    return min(1.0, bandwidth_part / spare)
