"""The sharding policy and the reproducible per-sample transforms."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from firescale.data.readers import Transform, global_order, iter_train_arrays, shard_indices
from firescale.data.transforms import BatchTransformer
from firescale.errors import FirescaleError


@pytest.mark.parametrize("size", [1, 2, 3])
def test_every_record_once_per_epoch_across_ranks(size):
    num_records, b = 48, 4  # 48 is a multiple of every global batch 4, 8, 12
    global_batch = b * size
    for epoch in range(2):
        seen = []
        for t in range(num_records // global_batch):
            start = epoch * num_records + t * global_batch
            for rank in range(size):
                seen.append(shard_indices(num_records, 7, start, global_batch, rank, size))
        seen = np.concatenate(seen)
        assert sorted(seen.tolist()) == list(range(num_records))
        assert np.array_equal(seen, global_order(num_records, 7, epoch))


def test_epochs_are_reshuffled_and_batches_may_straddle_them():
    assert not np.array_equal(global_order(50, 1, 0), global_order(50, 1, 1))
    assert np.array_equal(global_order(50, 1, 1), np.random.default_rng(2).permutation(50))
    batch = shard_indices(10, 3, 8, 4, 0, 1)  # positions 8, 9 of epoch 0 then 0, 1 of epoch 1
    assert batch.tolist() == global_order(10, 3, 0)[8:].tolist() + global_order(10, 3, 1)[:2].tolist()


@pytest.mark.parametrize("size", [2, 3])
def test_n_ranks_of_b_read_what_one_rank_of_n_b_reads(size):
    b = 5
    for start in (0, 15 * size, 37 * size):
        together = shard_indices(23, 11, start, b * size, 0, 1)
        split = np.concatenate([shard_indices(23, 11, start, b * size, r, size) for r in range(size)])
        assert np.array_equal(together, split)


def test_bad_sharding_arguments():
    with pytest.raises(FirescaleError, match="multiple"):
        shard_indices(10, 0, 0, 5, 0, 2)
    with pytest.raises(FirescaleError, match="rank 2"):
        shard_indices(10, 0, 0, 4, 2, 2)


@dataclass
class ArrayDataset:
    """An in-memory stand-in with the Dataset interface (read by index)."""

    images: np.ndarray
    labels: np.ndarray

    @property
    def num_records(self):
        return len(self.labels)

    @property
    def shape(self):
        return self.images.shape[1:]

    def read(self, indices):
        return self.images[indices], self.labels[indices]


@pytest.mark.parametrize("size", [2, 3])
def test_training_stream_with_random_crop_and_mirror_is_independent_of_ranks(size):
    rng = np.random.default_rng(0)
    ds = ArrayDataset(rng.integers(0, 256, (31, 6, 7, 3), dtype=np.uint8), np.arange(31) % 4)
    t = Transform(scale=0.5, mean=(1.0, 2.0, 3.0), crop=4, mirror=True)
    b = 4
    one = iter_train_arrays(ds, t, seed=5, rank=0, size=1, batch_per_rank=b * size, start_sample=12)
    many = [iter_train_arrays(ds, t, seed=5, rank=r, size=size, batch_per_rank=b, start_sample=12)
            for r in range(size)]
    for _ in range(4):
        x1, y1 = next(one)
        parts = [next(it) for it in many]
        assert x1.shape == (b * size, 4, 4, 3) and x1.dtype == np.float32
        assert np.array_equal(x1, np.concatenate([p[0] for p in parts]))
        assert np.array_equal(y1, np.concatenate([p[1] for p in parts]))


@pytest.mark.parametrize("size", [1, 2])
def test_batches_read_several_at_a_time_are_the_batches_read_one_at_a_time(size):
    rng = np.random.default_rng(1)
    ds = ArrayDataset(rng.integers(0, 256, (23, 6, 7, 3), dtype=np.uint8), np.arange(23) % 5)
    t = Transform(scale=0.5, mean=(1.0, 2.0, 3.0), crop=4, mirror=True)
    for r in range(size):
        single = iter_train_arrays(ds, t, seed=9, rank=r, size=size, batch_per_rank=3, start_sample=5)
        grouped = iter_train_arrays(ds, t, seed=9, rank=r, size=size, batch_per_rank=3, start_sample=5,
                                    batches_per_read=4)
        for _ in range(10):  # across epochs and reads: the 23 records in batches of 3 x size
            (x1, y1), (x4, y4) = next(single), next(grouped)
            assert x4.shape == (3, 4, 4, 3) and np.array_equal(x1, x4) and np.array_equal(y1, y4)


def test_transform_values_follow_caffe():
    image = np.arange(4 * 4, dtype=np.uint8).reshape(1, 4, 4, 1)
    centre = BatchTransformer(Transform(scale=2.0, mean=(1.0,), crop=2), (4, 4, 1))(image, train=False)
    assert centre[0, :, :, 0].tolist() == [[(5 - 1) * 2, (6 - 1) * 2], [(9 - 1) * 2, (10 - 1) * 2]]
    # mean image cropped at the same offset, then mirrored: (x - mean[src]) placed at the mirrored column
    mean = np.full((4, 4, 1), 1.0, np.float32)
    mean[1, 1, 0] = 5.0
    transformer = BatchTransformer(Transform(scale=1.0, mean=None, crop=None, mirror=True), (4, 4, 1))
    flips = [transformer(image, train=True, seed=0, positions=np.array([p]))[0, 0, 0, 0] for p in range(16)]
    assert {0.0, 3.0} == set(flips)  # some positions mirror (first pixel becomes 3), others do not
    transformer.mean = mean
    out = transformer(image, train=False)
    assert out[0, 1, 1, 0] == 5 - 5 and out[0, 0, 0, 0] == -1
    with pytest.raises(FirescaleError, match="crop 9"):
        BatchTransformer(Transform(crop=9), (4, 4, 1))
