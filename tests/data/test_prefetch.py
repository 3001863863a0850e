"""The trainer's batch hand-off: the reader's order kept, its errors raised in the training thread, stopped on close."""
from __future__ import annotations

import numpy as np
import pytest

from firescale.data.prefetch import PrefetchedBatches


def _batches(n: int, fail_at: int | None = None):
    for k in range(n):
        if k == fail_at:
            raise ValueError(f"record {k} is damaged")
        yield np.full((2, 3, 3, 1), k, np.float32), np.array([k, k], np.int64)


def test_batches_arrive_in_the_readers_order_as_tensors_and_the_stream_ends_with_the_reader():
    stream = PrefetchedBatches(_batches(5), depth=2)
    got = [(int(images[0, 0, 0, 0]), labels.dtype.name) for images, labels in stream]
    assert got == [(k, "int64") for k in range(5)]
    with pytest.raises(StopIteration):
        next(stream)


def test_a_reader_error_is_raised_by_next_and_close_stops_a_reader_blocked_on_a_full_queue():
    stream = PrefetchedBatches(_batches(4, fail_at=2), depth=1)
    next(stream), next(stream)
    with pytest.raises(ValueError, match="record 2 is damaged"):
        next(stream)
    endless = PrefetchedBatches(_batches(10**9), depth=1)
    next(endless)
    endless.close()
    assert not endless._thread.is_alive()
