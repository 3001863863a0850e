"""The batch arrays readers fill: a fresh one, or the caller's to reuse from batch to batch."""
from __future__ import annotations

import numpy as np


def batch_array(out: np.ndarray | None, n: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`out` checked to be a writable C-contiguous (n, *shape) array of `dtype`, or a new one."""
    if out is None:
        return np.empty((n, *shape), dtype)
    if out.shape != (n, *shape) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writable C-contiguous {np.dtype(dtype)} array of shape {(n, *shape)}, "
                         f"got {out.dtype} {out.shape}")
    return out


class BatchBuffer:
    """One array reused for every batch of a given size, for a caller that consumes each batch first."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._array: np.ndarray | None = None

    def get(self, n: int) -> np.ndarray:
        if self._array is None or len(self._array) != n:
            self._array = np.empty((n, *self.shape), self.dtype)
        return self._array


READ_BYTES = 1 << 20
READ_MAX = 32


def batches_per_read(batch: int, image_shape: tuple[int, ...]) -> int:
    """Training batches to read and transform in one go: as many as fit in READ_BYTES of float32, between
    1 and READ_MAX.  A small batch then pays the per-call costs of the reader and of numpy (tens of
    microseconds between steps that leave the caches cold) once per read, not once per batch: for LeNet's
    64 digits a rank, 32 a read instead of 8 took a further 0.035 ms, 1%, off each 3.7 ms iteration
    (docs/benchmarks/2026-12-03-pytorch-trainer-at-the-bare-loop.md).  The stall watch's default counts on
    reads of at most READ_MAX batches (jobs/stall.py)."""
    batch_bytes = max(1, batch * int(np.prod(image_shape)) * 4)
    return int(min(READ_MAX, max(1, READ_BYTES // batch_bytes)))
