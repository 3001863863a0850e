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
