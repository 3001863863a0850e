"""Allreduce cost models (parameter server, binomial tree, butterfly, ring, Rabenseifner) with α-β-γ terms."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import FirescaleError

ALGORITHMS = ("ps", "tree", "butterfly", "ring", "rabenseifner")
ALGORITHM_NAMES = {
    "ps": "parameter server (one-to-all; FireCaffe Eq. 3)",
    "tree": "binomial reduction tree (reduce + broadcast; FireCaffe Eq. 4)",
    "butterfly": "butterfly / recursive doubling",
    "ring": "ring (reduce-scatter + allgather)",
    "rabenseifner": "Rabenseifner (recursive halving + doubling)",
}
_ALIASES = {"parameter_server": "ps", "onetoall": "ps", "binomial": "tree", "recursive_doubling": "butterfly",
            "default": "tree"}


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
    key = name.lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in ALGORITHMS:
        raise FirescaleError(f"unknown allreduce algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return key


def tree_height(p: int) -> int:
    """Depth of a binomial tree over p nodes: ceil(log2 p)."""
    return 0 if p <= 1 else math.ceil(math.log2(p))


def parameter_server_time(nbytes: float, p: int, link: Link) -> float:
    """Gather p-1 gradients to one node, sum them, send the sum back to p-1 nodes, one at a time.

    With α = γ = 0 this is Paleo's OneToAll, 2(p-1)·n/BW; FireCaffe's Eq. 3, p·n/BW, is the same
    traffic on a full-duplex link whose sends and receives overlap.
    """
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * (link.alpha + nbytes * link.beta) + (p - 1) * nbytes * link.gamma


def tree_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Binomial reduction to a root in ceil(log2 p) steps, then broadcast down the same tree (Eq. 4)."""
    h = tree_height(p)
    return 2 * h * (link.alpha + nbytes * link.beta) + h * nbytes * link.gamma


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
    "tree": tree_allreduce_time,
    "butterfly": butterfly_allreduce_time,
    "ring": ring_allreduce_time,
    "rabenseifner": rabenseifner_allreduce_time,
}


def allreduce_time(algorithm: str, nbytes: float, p: int, link: Link) -> float:
    """Seconds to allreduce `nbytes` over `p` nodes with the named algorithm."""
    if p < 1:
        raise FirescaleError(f"the number of nodes must be at least 1, not {p}")
    return _MODELS[canonical_algorithm(algorithm)](float(nbytes), int(p), link)


def fit_comm_ppp(algorithm: str, nbytes: float, p: int, measured_seconds: float, link: Link) -> float:
    """The communication percent of peak that makes the model give the measured allreduce time.

    The latency and reduction terms are kept; the bandwidth term absorbs the rest.
    """
    if p <= 1:
        raise FirescaleError("fitting a communication percent of peak needs an allreduce over at least 2 ranks")
    ideal = Link(link.bandwidth, link.latency, 1.0, link.reduce_rate)
    fixed = allreduce_time(algorithm, 0.0, p, ideal)   # latency terms only
    fixed += allreduce_time(algorithm, nbytes, p, Link(link.bandwidth * 1e12, 0.0, 1.0, link.reduce_rate))
    bandwidth_part = allreduce_time(algorithm, nbytes, p, Link(link.bandwidth, 0.0, 1.0, None))
    spare = measured_seconds - fixed
    if spare <= 0:
        raise FirescaleError(f"the measured allreduce time {measured_seconds:.3g} s is below the model's "
                             f"latency and reduction terms ({fixed:.3g} s); lower the link latency")
    return min(1.0, bandwidth_part / spare)
