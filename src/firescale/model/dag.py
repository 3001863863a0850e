"""The DAG model of synchronous SGD (Shi et al.): naive S-SGD, or I/O and per-layer communication overlapped."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """One simulated iteration (seconds or any one time unit, as given)."""

    forward: float
    backward: float
    comm: float              # all gradient communication, summed
    comm_exposed: float      # t_c^no: the part not hidden behind the backward pass
    update: float
    io: float                # t_io: reading the batch
    iteration: float
    h2d: float = 0.0         # t_h2d: copying the batch to the device
    data_wait: float = 0.0   # a wait for data measured as exposed: in series, whatever the schedule


def wait_free_schedule(forward: Sequence[float], backward: Sequence[float], comm: Sequence[float], *,
                       update: float = 0.0, io: float = 0.0, overlap: bool = True,
                       overlap_io: bool = True, h2d: float = 0.0, data_wait: float = 0.0) -> Schedule:
    """Replay one iteration of L layers listed input first.

    The backward pass runs from layer L down to 1; with `overlap` (wait-free backprop, Eq. 4-5) the
    gradient of layer l is communicated as soon as its backward task ends, one message at a time on
    the link, while lower layers keep computing; without it all communication follows the backward
    pass.  With `overlap_io` reading the next batch and copying it to the device run beside the
    computation (Eq. 3), otherwise they precede it.  With neither, this is naive S-SGD (Eq. 2): I/O,
    host-to-device copy, forward, backward, communication and update in series.

    `data_wait` is not a DAG task but what a trainer measured waiting for its batch: the part of the
    I/O its prefetching did not hide.  It is already exposed, so it is added in series and never
    overlapped again.
    """
    n = len(forward)
    if not (len(backward) == len(comm) == n):
        raise ValueError(f"forward, backward and comm need one entry per layer: {n}, {len(backward)}, {len(comm)}")
    t_f = float(sum(forward))
    t_b = float(sum(backward))
    t_c = float(sum(comm))
    clock = t_f
    link_free = 0.0
    if overlap:
        for layer in reversed(range(n)):
            clock += backward[layer]
            if comm[layer] > 0:
                start = max(clock, link_free)
                link_free = start + comm[layer]
        end = max(clock, link_free)
    else:
        end = t_f + t_b + t_c
    exposed = end - (t_f + t_b)
    compute_path = end + update
    fetch = io + h2d
    iteration = data_wait + (max(fetch, compute_path) if overlap_io else fetch + compute_path)
    return Schedule(t_f, t_b, t_c, exposed, update, io, iteration, h2d, data_wait)


def wait_free_iteration(forward: Sequence[float], backward: Sequence[float], comm: Sequence[float], *,
                        update: float = 0.0, io: float = 0.0) -> float:
    """Iteration time with I/O and per-layer communication overlapped (Eq. 5)."""
    return wait_free_schedule(forward, backward, comm, update=update, io=io).iteration


def dag_speedup(t_iter_1: float, t_iter_n: float, gpus: int) -> float:
    """Eq. 6: N_g · t_iter(1) / t_iter(N_g), the throughput speedup under weak scaling."""
    return gpus * t_iter_1 / t_iter_n
