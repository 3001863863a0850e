"""The sharding policy: which records each rank reads at each step, reproducibly and resumably.

The training stream is the concatenation of per-epoch permutations of the records: epoch e is
`numpy.random.default_rng(seed + e).permutation(num_records)`.  Global batch t is
`stream[t*B:(t+1)*B]` with B = size * b, and rank r takes the contiguous slice `[r*b:(r+1)*b]` of it.
Hence every record is seen exactly once per epoch across all ranks, N ranks with batch b read exactly
what one rank with batch N*b reads, and the only data-order state to checkpoint is the stream position
`start_sample` (= t*B) with the seed.  A batch may straddle two epochs; positions, not batches,
decide the epoch.
"""
from __future__ import annotations

import numpy as np

from firescale.errors import FirescaleError


def global_order(num_records: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of record indices that epoch `epoch` visits (int64)."""
    if num_records <= 0:
        raise FirescaleError(f"a dataset needs at least one record to be shuffled, got {num_records}")
    return np.random.default_rng(seed + epoch).permutation(num_records).astype(np.int64)


class EpochOrders:
    """The stream of per-epoch permutations, keeping the last two epochs' permutations at hand."""

    def __init__(self, num_records: int, seed: int) -> None:
        self.num_records = int(num_records)
        self.seed = int(seed)
        self._orders: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = global_order(self.num_records, self.seed, epoch)
        return self._orders[epoch]

    def records_at(self, positions: np.ndarray) -> np.ndarray:
        """Record index at each stream position."""
        epochs = positions // self.num_records
        within = positions % self.num_records
        out = np.empty(len(positions), np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            out[sel] = self.order(int(epoch))[within[sel]]
        return out


def rank_positions(start_sample: int, global_batch: int, rank: int, size: int) -> np.ndarray:
    """Stream positions of rank `rank`'s part of the global batch that starts at `start_sample`."""
    if size < 1 or not 0 <= rank < size:
        raise FirescaleError(f"rank {rank} is not in 0..{size - 1} (size {size})")
    if global_batch < size or global_batch % size:
        raise FirescaleError(f"the global batch {global_batch} must be a positive multiple of the {size} ranks")
    if start_sample < 0:
        raise FirescaleError(f"start_sample must be >= 0, got {start_sample}")
    per_rank = global_batch // size
    first = start_sample + rank * per_rank
    return np.arange(first, first + per_rank, dtype=np.int64)


def shard_indices(num_records: int, seed: int, start_sample: int, global_batch: int, rank: int,
                  size: int) -> np.ndarray:
    """The record indices rank `rank` of `size` reads for the global batch starting at `start_sample`."""
    positions = rank_positions(start_sample, global_batch, rank, size)
    return EpochOrders(num_records, seed).records_at(positions)
