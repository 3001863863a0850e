"""The DAG model's data tasks: t_io, reading a batch as a node's ranks contend, and t_h2d, copying it to the device."""
from __future__ import annotations

import math
from dataclasses import dataclass

from firescale.errors import FirescaleError

FLOAT32_BYTES = 4   # the trainer hands the device float32 NHWC images (data/readers.py)


@dataclass(frozen=True)
class DataPath:
    """Where a rank's batch comes from, in bytes per second; 0 leaves that task out of the model.

    `read_bandwidth` is what one node reads from the dataset's filesystem (the DAG paper's B_io, by
    `dd`); the ranks of a node share it.  `shared_read_bandwidth` is what the shared filesystem serves
    all nodes together.  `h2d_bandwidth` is one device's host-to-device copy (B_pcie); each device has its
    own.  `overlap_io`: a reader thread keeps the next batch ready while the rank computes (Eq. 3), so
    the iteration is the longer of the two; otherwise the rank reads, then copies, then computes.
    `read_source` says where `read_bandwidth` came from: "site" (its storage.read_gbytes_per_s),
    "calibration" (a `bench io` record stored by `predict calibrate`), or "" (the caller's own).
    `rank_read_bandwidth` is a limit on each rank's own reads (`firescale train --read-limit-mbs`,
    an experiment's `read_limit_mbs`): slower storage emulated on the storage at hand.
    """

    read_bandwidth: float = 0.0
    shared_read_bandwidth: float = 0.0
    h2d_bandwidth: float = 0.0
    overlap_io: bool = True
    read_source: str = ""
    rank_read_bandwidth: float = 0.0

    def __post_init__(self) -> None:
        for key in ("read_bandwidth", "shared_read_bandwidth", "h2d_bandwidth", "rank_read_bandwidth"):
            value = getattr(self, key)
            if not (value >= 0 and math.isfinite(value)):
                raise FirescaleError(f"data path: {key} must be a finite number of bytes per second >= 0, not {value}")


def io_time(batch_per_rank: int, image_bytes: float, ranks: int, ranks_per_node: int, path: DataPath) -> float:
    """t_io of Eq. 6 for `ranks` ranks placed `ranks_per_node` to a node: each reads `batch_per_rank`
    images of `image_bytes`; the ranks of one node share its read bandwidth, and all ranks the shared
    filesystem's; a rank's own read limit bounds its reads alone; the slowest bounds the read."""
    if batch_per_rank < 1 or image_bytes < 0 or ranks < 1 or ranks_per_node < 1:
        raise FirescaleError(f"t_io needs a batch >= 1, image bytes >= 0 and ranks >= 1, got batch {batch_per_rank}, "
                             f"{image_bytes} bytes, {ranks} ranks, {ranks_per_node} per node")
    batch_bytes = batch_per_rank * image_bytes
    on_node = min(ranks, ranks_per_node)
    times = []
    if path.read_bandwidth > 0:
        times.append(on_node * batch_bytes / path.read_bandwidth)
    if path.shared_read_bandwidth > 0:
        times.append(ranks * batch_bytes / path.shared_read_bandwidth)
    if path.rank_read_bandwidth > 0:
        times.append(batch_bytes / path.rank_read_bandwidth)
    return max(times, default=0.0)


def h2d_time(batch_per_rank: int, input_shape: tuple[int, ...], path: DataPath) -> float:
    """t_h2d: the rank's batch, as the float32 images the net takes, over its device's host link."""
    if path.h2d_bandwidth <= 0:
        return 0.0
    return batch_per_rank * math.prod(input_shape) * FLOAT32_BYTES / path.h2d_bandwidth


def fetch_then_compute(io: float, h2d: float, compute: float, overlap_io: bool) -> float:
    """An iteration's data tasks beside the rest: Eq. 3's max(t_io + t_h2d, compute) when the next batch
    is read while this one computes, else Eq. 1-2's sum."""
    fetch = io + h2d
    return max(fetch, compute) if overlap_io else fetch + compute
