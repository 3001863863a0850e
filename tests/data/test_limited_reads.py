"""A read limit (`train --read-limit-mbs`): each read takes at least its stored bytes / the limit and returns the
same records; in the reader thread, prefetching hides it from a consumer slower than the limit."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from firescale.data.hdf5_io import Hdf5Reader, write_hdf5
from firescale.data.prefetch import PrefetchedBatches
from firescale.data.readers import Dataset, Transform, iter_train_arrays
from firescale.data.throttle import MB, LimitedReads, limit_reads

SHAPE = (8, 8, 1)   # the digits' records: 64 bytes each


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (64, *SHAPE), dtype=np.uint8)
    write_hdf5(tmp_path / "train.h5", images, rng.integers(0, 10, 64), [str(k) for k in range(10)])
    reader = Hdf5Reader(tmp_path / "train.h5")
    ds = Dataset(tmp_path, "train", "hdf5", 64, SHAPE, 10, None, reader.classes, reader)
    yield ds
    ds.close()


def test_each_read_takes_at_least_its_bytes_over_the_limit_and_returns_the_same_records(dataset):
    limited = limit_reads(dataset, 0.02)   # 20,000 bytes a second: 16 records of 64 bytes take 51.2 ms
    assert isinstance(limited.reader, LimitedReads) and limit_reads(dataset, None) is dataset
    indices = np.array([5, 0, 63, 5, 17, 2, 40, 41, 9, 12, 33, 30, 60, 1, 7, 8])
    out = np.empty((16, *SHAPE), np.uint8)
    for kwargs in ({}, {"out": out}):
        start = time.perf_counter()
        images, labels = limited.read(indices, **kwargs)
        took = time.perf_counter() - start
        assert took >= 16 * 64 / (0.02 * MB)
        want_images, want_labels = dataset.read(indices)
        assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    assert images is out   # the caller's batch array is still filled in place
    with pytest.raises(ValueError, match="bytes per second > 0"):
        LimitedReads(dataset.reader, 0.0)


def test_in_the_reader_thread_prefetching_hides_the_limit_from_a_slower_consumer(dataset):
    # 4 records a batch, 256 bytes, at 0.005 MB/s: 51.2 ms a read; the consumer spends 150 ms on each batch.
    def stream(ds):
        return iter_train_arrays(ds, Transform(), seed=1, rank=0, size=1, batch_per_rank=4)

    batch_s = 4 * 64 / (0.005 * MB)
    inline = stream(limit_reads(dataset, 0.005))
    start = time.perf_counter()
    for _ in range(3):
        next(inline)
    assert time.perf_counter() - start >= 3 * batch_s   # read in the caller's thread: the caller waits
    prefetched = PrefetchedBatches(stream(limit_reads(dataset, 0.005)), depth=2)
    try:
        expected = stream(dataset)
        next(prefetched), next(expected)    # the first hand-off imports TensorFlow
        waited = 0.0
        for _ in range(6):
            time.sleep(0.15)     # the step
            start = time.perf_counter()
            images, labels = next(prefetched)
            waited += time.perf_counter() - start
            want_images, want_labels = next(expected)
            assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    finally:
        prefetched.close()
    assert waited < 6 * batch_s / 2   # most of the six reads' 307 ms ran during the steps
