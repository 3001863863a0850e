"""Two-level links: an allreduce over nodes of several ranks, each hop on the intra- or inter-node link."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from firescale.errors import FirescaleError
from firescale.model.comm import (
    Link,
    allreduce_time,
    butterfly_allreduce_time,
    canonical_algorithm,
    fit_comm_ppp,
    parameter_server_time,
    resolve_algorithm,
    ring_allreduce_time,
    tree_allreduce_time,
    tree_height,
)

HIERARCHICAL = "hierarchical"   # Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE, as an algorithm name's prefix


@dataclass(frozen=True)
class NodeLinks:
    """How a platform's ranks sit on nodes and which link joins two of them.

    Ranks fill nodes in order, `ranks_per_node` to a node (rank r on node r // ranks_per_node), as the
    site's launcher places them.  `intra` is the link between two ranks of one node (PCIe, NVLink,
    shared memory); None means one link for every hop, the platform's own, as before two levels.
    `hierarchical` is Horovod's hierarchical allreduce: within each node, across nodes, within again.
    `intra_ppp` is the intra-node link's percent of peak when a calibration measured it apart (an
    allreduce within one node); None: it takes the platform link's, as one calibration fits both.
    """

    ranks_per_node: int = 1
    intra: Link | None = None
    hierarchical: bool = False
    intra_ppp: float | None = None

    def __post_init__(self) -> None:
        if self.ranks_per_node < 1:
            raise FirescaleError(f"ranks_per_node must be at least 1, not {self.ranks_per_node}")
        if self.intra_ppp is not None and not 0 < self.intra_ppp <= 1:
            raise FirescaleError(f"the intra-node link's percent of peak must be in (0, 1], not {self.intra_ppp}")


@dataclass(frozen=True)
class CommParts:
    """One allreduce's seconds, split as Paleo splits scale-up from scale-out: the steps a node's own link
    bounds (`intra`) and the steps the link between nodes bounds (`inter`)."""

    intra: float
    inter: float
    total: float = math.nan   # intra + inter, unless a one-link model's own total is given (rounding)

    def __post_init__(self) -> None:
        if math.isnan(self.total):
            object.__setattr__(self, "total", self.intra + self.inter)


def node_counts(ranks: int, ranks_per_node: int) -> tuple[int, int]:
    """Nodes used by `ranks` ranks placed `ranks_per_node` to a node, and the ranks on the fullest one."""
    if ranks < 1:
        raise FirescaleError(f"the number of ranks must be at least 1, not {ranks}")
    return math.ceil(ranks / ranks_per_node), min(ranks, ranks_per_node)


def hierarchical_choice(name: str, knob: bool) -> tuple[bool, str]:
    """Whether an allreduce is hierarchical, and the algorithm across nodes: a name `hierarchical-ALGO`
    (or `hierarchical_ALGO`) asks for it whatever the knob; otherwise the site's knob decides."""
    key = name.lower().replace("_", "-")
    if key.startswith(HIERARCHICAL + "-"):
        return True, key[len(HIERARCHICAL) + 1:]
    if key == HIERARCHICAL:
        raise FirescaleError(f"allreduce {name!r} needs the algorithm across nodes, e.g. hierarchical-tree or "
                             "hierarchical-ring")
    return knob, name


def _node(rank: int, k: int) -> int:
    return rank // k


def _step_links(pairs: list[tuple[int, int]], k: int) -> tuple[bool, bool]:
    """Whether a step's concurrent messages use an intra-node hop, and an inter-node one."""
    crossing = [_node(a, k) != _node(b, k) for a, b in pairs]
    return (not all(crossing)), any(crossing)


Cost = Callable[[Link], float]   # one step's (or a whole allreduce's) seconds on a given link


def _slowest(uses_intra: bool, uses_inter: bool, intra: Link, inter: Link, cost: Cost) -> tuple[float, str]:
    """A step's time: its messages run at once, so the slowest link it uses bounds it; and which link that is
    (the network's when the two are as fast: the step crosses nodes)."""
    if not uses_inter:
        return cost(intra), "intra"
    across = cost(inter)
    within = cost(intra) if uses_intra else 0.0
    return (within, "intra") if within > across else (across, "inter")


def _per_step(steps: list[tuple[bool, bool]], intra: Link, inter: Link, cost: Cost) -> CommParts:
    parts = {"intra": 0.0, "inter": 0.0}
    for uses_intra, uses_inter in steps:
        seconds, which = _slowest(uses_intra, uses_inter, intra, inter, cost)
        parts[which] += seconds
    return CommParts(parts["intra"], parts["inter"])


def _tree_steps(p: int, k: int) -> list[tuple[bool, bool]]:
    """Binomial tree steps over node-ordered ranks; at step j rank i + 2^j sends to rank i (i a multiple of 2^(j+1))."""
    out = []
    for j in range(tree_height(p)):
        d = 1 << j
        out.append(_step_links([(i, i + d) for i in range(0, p - d, 2 * d)], k))
    return out


def _butterfly_steps(p: int, k: int) -> list[tuple[bool, bool]]:
    """Recursive doubling's steps: at step j rank i exchanges with rank i XOR 2^j."""
    out = []
    for j in range(tree_height(p)):
        d = 1 << j
        out.append(_step_links([(i, i ^ d) for i in range(p) if (i ^ d) < p], k))
    return out


def flat_allreduce(model: str, nbytes: float, p: int, k: int, intra: Link, inter: Link) -> CommParts:
    """A flat allreduce (one communicator of all ranks) of a resolved cost model over n nodes of k ranks.

    The ring's every step has every rank send at once, so once it spans nodes the slower link bounds
    each of its 2(p-1) steps.  A binomial tree's and a butterfly's steps each pair ranks 2^j apart: a step
    is on the intra-node link while all its pairs share a node, else the slower link bounds it.  The
    parameter server talks to the ranks of its own node over the intra-node link and to the others over
    the link between nodes.  A binary tree and Rabenseifner's halving are not split by step: across nodes
    the slower link is taken for all of them (an upper bound).
    """
    nodes, _ = node_counts(p, k)
    if p <= 1:
        return CommParts(0.0, 0.0)
    if nodes == 1:
        return CommParts(allreduce_time(model, nbytes, p, intra), 0.0)
    if model == "ring":
        cost = lambda link: ring_allreduce_time(nbytes, p, link)  # noqa: E731
        return _per_step([(k > 1, True)], intra, inter, cost)
    if model == "tree":
        return _per_step(_tree_steps(p, k), intra, inter, lambda link: tree_allreduce_time(nbytes, 2, link))
    if model == "butterfly":
        return _per_step(_butterfly_steps(p, k), intra, inter, lambda link: butterfly_allreduce_time(nbytes, 2, link))
    if model == "ps":
        local = min(p, k)   # the server is rank 0; the ranks of its node reach it without the network
        one = lambda link: parameter_server_time(nbytes, 2, link)  # noqa: E731
        return CommParts((local - 1) * one(intra), (p - local) * one(inter))
    if model == "firecaffe-ps":
        # FireCaffe's Eq. 3, p(α + nβ) + (p-1)nγ: the server's own node's `local` gradients, then the rest.
        local = min(p, k)
        intra_part = local * (intra.alpha + nbytes * intra.beta) + (local - 1) * nbytes * intra.gamma
        return CommParts(intra_part, (p - local) * (inter.alpha + nbytes * (inter.beta + inter.gamma)))
    seconds, which = _slowest(k > 1, True, intra, inter, lambda link: allreduce_time(model, nbytes, p, link))
    return CommParts(seconds, 0.0) if which == "intra" else CommParts(0.0, seconds)


def hierarchical_allreduce(algorithm: str, nbytes: float, p: int, k: int, intra: Link, inter: Link) -> CommParts:
    """Horovod's hierarchical allreduce (NCCLHierarchicalAllreduce, Horovod 0.28.1) over n nodes of k ranks.

    With every node full it reduce-scatters within each node (a ring of k), then each of the k local
    ranks allreduces its 1/k of the gradient across the n nodes with MPI (the site's `algorithm`), all k
    at once through the node's one network link, so each gets 1/k of its bandwidth; then it allgathers
    within the node.  With the last node not full it reduces within each node to one rank, allreduces the
    whole gradient among those n ranks, and broadcasts within the node (a binomial tree each way here).
    """
    nodes, local = node_counts(p, k)
    if p <= 1:
        return CommParts(0.0, 0.0)
    if p % k == 0:
        within = ring_allreduce_time(nbytes, local, intra) if local > 1 else 0.0
        shared = replace(inter, bandwidth=inter.bandwidth / local)
        across = allreduce_time(algorithm, nbytes / local, nodes, shared) if nodes > 1 else 0.0
        return CommParts(within, across)
    within = tree_allreduce_time(nbytes, local, intra)
    return CommParts(within, allreduce_time(algorithm, nbytes, nodes, inter) if nodes > 1 else 0.0)


def two_level_allreduce(algorithm: str, nbytes: float, p: int, link: Link, links: NodeLinks) -> CommParts:
    """Seconds to allreduce `nbytes` over `p` ranks, split into intra- and inter-node parts.

    `link` is the platform's link between nodes; the intra-node link takes its reduction rate, and its
    percent of peak unless one was measured apart (`links.intra_ppp`).  Without an intra-node link every
    hop is on `link` and the total is exactly model/comm.py's allreduce_time.
    """
    hierarchical, name = hierarchical_choice(algorithm, links.hierarchical)
    k = links.ranks_per_node
    intra = link if links.intra is None else replace(
        links.intra, ppp=link.ppp if links.intra_ppp is None else links.intra_ppp, reduce_rate=link.reduce_rate)
    if hierarchical:
        return hierarchical_allreduce(canonical_algorithm(name), nbytes, p, k, intra, link)
    key = canonical_algorithm(name)
    if key == "nccl-default":   # NCCL runs the faster of its ring and tree for this size, here on two levels
        parts = min((flat_allreduce(m, nbytes, p, k, intra, link) for m in ("ring", "tree")), key=lambda c: c.total)
    else:
        parts = flat_allreduce(resolve_algorithm(key, nbytes, p, link), nbytes, p, k, intra, link)
    if links.intra is None:
        # One link for every hop: the total as before, its split kept.
        total = allreduce_time(key, nbytes, p, link)
        return CommParts(parts.intra, total - parts.intra, total)
    return parts


def fit_intra_node_ppp(algorithm: str, nbytes: float, p: int, seconds: float, link: Link, links: NodeLinks) -> float:
    """The intra-node link's percent of peak from an allreduce of `p` ranks within one node, every hop on it
    (with the platform link's reduction rate, as two_level_allreduce gives it)."""
    if links.intra is None or p > links.ranks_per_node:
        raise FirescaleError(f"an allreduce of {p} ranks within one node needs a node of at least {p} ranks and an "
                             f"intra-node link (this platform: {links.ranks_per_node} a node, "
                             f"{'an' if links.intra else 'no'} intra-node link)")
    return fit_comm_ppp(algorithm, nbytes, p, seconds, replace(links.intra, reduce_rate=link.reduce_rate))


def fit_inter_node_ppp(algorithm: str, nbytes: float, p: int, seconds: float, link: Link, links: NodeLinks) -> float:
    """The percent of peak of the link between nodes that makes two_level_allreduce give the measured
    `seconds` for `nbytes` over `p` ranks, the intra-node link at `links.intra_ppp` (or tied to it, when
    None).  With one link for every hop it is model/comm.py's fit_comm_ppp.  The total falls as the factor
    rises, so it is found by bisection (on its logarithm); a measurement at or under the time at the
    peak keeps the peak, as fit_comm_ppp caps at 1."""
    if links.intra is None:
        return fit_comm_ppp(algorithm, nbytes, p, seconds, link)
    if p <= links.ranks_per_node:
        raise FirescaleError(f"an allreduce of {p} ranks stays within one node of {links.ranks_per_node}; "
                             "fitting the link between nodes needs ranks on two or more")

    def total(ppp: float) -> float:
        return two_level_allreduce(algorithm, nbytes, p, replace(link, ppp=ppp), links).total

    if seconds <= total(1.0):
        return 1.0
    low, high = 1e-9, 1.0       # total(low) > seconds >= total(high) is kept
    if total(low) <= seconds:
        return low
    for _ in range(100):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if total(mid) > seconds else (low, mid)
        if high / low < 1 + 1e-9:
            break
    return high


def algorithm_label(algorithm: str, nbytes: float, p: int, link: Link, links: NodeLinks) -> str:
    """What runs for one allreduce: the resolved model, or `hierarchical(MODEL)` with the model across nodes."""
    hierarchical, name = hierarchical_choice(algorithm, links.hierarchical)
    if not hierarchical:
        return resolve_algorithm(name, nbytes, p, link)
    nodes, local = node_counts(p, links.ranks_per_node)
    across = nbytes / local if p % links.ranks_per_node == 0 else nbytes
    return f"{HIERARCHICAL}({resolve_algorithm(name, across, max(nodes, 1), link)})"

