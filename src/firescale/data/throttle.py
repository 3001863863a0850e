"""A read-rate limit on a dataset's reads: slower storage emulated on the storage at hand."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from firescale.data.readers import Dataset

MB = 1e6   # a read limit's megabyte, as `bench io` counts MB/s


class LimitedReads:
    """A dataset reader each of whose reads takes at least its bytes / `bytes_per_s`: after the read, the
    calling thread sleeps for the rest of that time (a reader thread, when the batches are prefetched, so
    that prefetching can hide it as it would hide slow storage).

    The bytes counted are the records' stored pixels as the reader returns them, before any transform:
    H x W x C at the stored type, one byte a pixel for our datasets and Caffe's raw Datums, four for
    float Datums and Caffe's HDF5 files.  They are the bytes `predict experiment`'s t_io counts per
    image; labels and an LMDB Datum's few header bytes are not counted.
    """

    def __init__(self, reader: Any, bytes_per_s: float) -> None:
        if not (bytes_per_s > 0 and np.isfinite(bytes_per_s)):
            raise ValueError(f"a read limit is a finite number of bytes per second > 0, not {bytes_per_s}")
        self.reader = reader
        self.bytes_per_s = float(bytes_per_s)
        self.dtype = reader.dtype

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        start = time.perf_counter()
        images, labels = self.reader.read(indices) if out is None else self.reader.read(indices, out=out)
        wait_until(start + images.nbytes / self.bytes_per_s)
        return images, labels

    def close(self) -> None:
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()


def wait_until(deadline: float) -> None:
    """Sleep until time.perf_counter() reaches `deadline` (at least that long: a sleep may end early)."""
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


def limit_reads(ds: Dataset, mb_per_s: float | None) -> Dataset:
    """`ds` with each read taking at least its bytes / `mb_per_s` MB/s (LimitedReads); `ds` itself for None."""
    if mb_per_s is None:
        return ds
    return replace(ds, reader=LimitedReads(ds.reader, mb_per_s * MB))
