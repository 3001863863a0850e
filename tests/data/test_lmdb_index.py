"""LmdbReader's value index: one C gather per batch from data.mdb's map, identical to LMDB's lookups."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from firescale.caffe.datum import encode_datum, image_to_datum
from firescale.caffe.pixels import PIXELS_KERNEL, compiled_kernel
from firescale.data.lmdb_io import LmdbReader, LmdbWriter
from firescale.errors import FirescaleError

needs_c = pytest.mark.skipif(PIXELS_KERNEL != "c", reason="the value index reads through the compiled kernel")


def write(path: Path, images: np.ndarray, labels: np.ndarray, keys: list[bytes] | None = None) -> None:
    with LmdbWriter(path, estimated_bytes=images.nbytes * 2 + (1 << 20)) as writer:
        for i, (image, label) in enumerate(zip(images, labels)):
            key = keys[i] if keys else b"%08d" % i
            writer.put(key, encode_datum(image_to_datum(image, int(label))))


@needs_c
@pytest.mark.parametrize("shape", [(7, 5, 1), (6, 4, 3), (40, 48, 3)])  # small, colour, overflow pages
def test_indexed_reads_equal_lmdb_lookups_in_random_order_with_duplicates_and_a_reused_batch(tmp_path, shape):
    rng = np.random.default_rng(5)
    n = 300 if shape[0] < 10 else 30
    images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    labels = rng.integers(0, 1000, n)  # labels of one and two varint bytes
    write(tmp_path / "x.lmdb", images, labels)
    orders = [rng.integers(0, n, 25) for _ in range(3)]
    for order in orders:
        order[3] = order[11]  # a duplicate in the batch
    slow = LmdbReader(tmp_path / "x.lmdb", index=False)  # LMDB allows one environment per file and process
    assert not slow.indexed
    wanted = [slow.read(order) for order in orders]
    keys = slow.keys
    slow.close()
    fast = LmdbReader(tmp_path / "x.lmdb")
    assert fast.indexed and fast.keys == keys
    out = np.full((25, *shape), 7, np.uint8)
    for order, (want, want_labels) in zip(orders, wanted):
        got, got_labels = fast.read(order, out=out)
        assert got is out
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, images[order])
        np.testing.assert_array_equal(got_labels, want_labels)
        np.testing.assert_array_equal(got_labels, labels[order])
    assert fast.read(np.array([], np.int64))[0].shape == (0, *shape)
    with pytest.raises(FirescaleError, match=r"record index out of range"):
        fast.read(np.array([0, n]))
    fast.close()


@needs_c
def test_keys_other_than_dense_indices_keep_lmdb_lookups(tmp_path):
    images = np.arange(3 * 16, dtype=np.uint8).reshape(3, 4, 4, 1)
    keys = [b"00000000_a.jpg", b"00000001_b.jpg", b"00000002_c.jpg"]
    write(tmp_path / "p.lmdb", images, np.array([0, 1, 2]), keys=keys)
    reader = LmdbReader(tmp_path / "p.lmdb")
    assert not reader.indexed
    np.testing.assert_array_equal(reader.read(np.array([2, 0]))[0], images[[2, 0]])
    reader.close()


@needs_c
def test_odd_record_goes_to_the_full_decoder_and_names_its_key(tmp_path):
    images = np.random.default_rng(2).integers(0, 256, (50, 3, 3, 1), dtype=np.uint8)
    with LmdbWriter(tmp_path / "o.lmdb", estimated_bytes=1 << 20) as writer:
        for i, image in enumerate(images):
            value = encode_datum(image_to_datum(image, 1))
            writer.put(b"%08d" % i, value[:20] if i == 9 else value)  # record 9 cut short
    reader = LmdbReader(tmp_path / "o.lmdb")
    assert reader.indexed
    np.testing.assert_array_equal(reader.read(np.array([8, 10]))[0], images[[8, 10]])
    with pytest.raises(FirescaleError, match=r"o.lmdb/data.mdb record key 00000009: "):
        reader.read(np.array([1, 9]))
    reader.close()


@needs_c
def test_file_cut_short_after_open_names_the_first_lost_key(tmp_path):
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (2000, 8, 8, 1), dtype=np.uint8)
    write(tmp_path / "t.lmdb", images, np.zeros(2000, np.int64))
    reader = LmdbReader(tmp_path / "t.lmdb")
    assert reader.indexed
    last = int(np.argmax(reader._offsets))
    cut = int(reader._offsets[last]) + 5
    os.truncate(tmp_path / "t.lmdb" / "data.mdb", cut)
    np.testing.assert_array_equal(reader.read(np.array([0]))[0], images[[0]])  # before the cut: still read
    with pytest.raises(FirescaleError, match=rf"t.lmdb/data.mdb record key {last:08d} needs bytes "
                                             rf"\d+..\d+ but the file has {cut} bytes; it is truncated"):
        reader.read(np.array([0, last]))
    reader.close()


@needs_c
def test_gather_refuses_records_outside_the_map():
    kernel = compiled_kernel()
    data = bytes(64)
    dst = np.empty((1, 2, 2, 1), np.uint8)
    labels = np.empty(1, np.int64)
    with pytest.raises(ValueError, match=r"record 0 at offset 60 with 10 bytes lies outside the map of 64 bytes"):
        kernel.decode_raw_datums_at(data, np.array([60]), np.array([10]), b"", dst, labels, 1, 2, 2)
    with pytest.raises(ValueError, match=r"lengths must be int64 of the same length"):
        kernel.decode_raw_datums_at(data, np.array([0]), np.array([1, 2]), b"", dst, labels, 1, 2, 2)
