"""The fast read paths (per-record copies from LMDB's map, HDF5 chunks read into the batch) give exact
arrays, reuse the caller's batch, and name the key or record of whatever they cannot read."""
from __future__ import annotations

import os
from pathlib import Path

import lmdb
import numpy as np
import pytest

from firescale.caffe.datum import RawDatumCodec, datum_key, datum_to_image, decode_datum, encode_datum, image_to_datum
from firescale.data.hdf5_io import Hdf5Reader, write_hdf5
from firescale.data.lmdb_io import LmdbReader, LmdbWriter, iter_lmdb
from firescale.data.lmdb_pages import lost_records, record_spans
from firescale.errors import FirescaleError

SHAPE = (48, 40, 3)  # 5,760 bytes a record: the per-record path (4,096 bytes and up)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    """40 records of 48x40x3 in an LMDB (train.lmdb) and our HDF5 layout (train.h5)."""
    out = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (40, *SHAPE), dtype=np.uint8)
    labels = rng.integers(0, 5, 40)
    with LmdbWriter(out / "train.lmdb", estimated_bytes=images.nbytes + (1 << 20)) as writer:
        for i, (image, label) in enumerate(zip(images, labels)):
            writer.put_image(i, image, int(label))
    write_hdf5(out / "train.h5", images, labels, [str(k) for k in range(5)])
    return out, images, labels


@pytest.mark.parametrize("kernel", ["c", "numpy"])
def test_per_record_and_joined_codecs_agree_with_the_full_decode(kernel):
    rng = np.random.default_rng(5)
    shape = (3, 2, 3)
    images = rng.integers(0, 256, (7, *shape), dtype=np.uint8)
    labels = [1, 200, 7, 127, 128, 0, 70000]
    values = [encode_datum(image_to_datum(x, y)) for x, y in zip(images, labels)]
    values[2] = values[2][:-2]  # no explicit encoded=false
    values[5] = b"\x28\x00" + values[5][:-4]  # the label first: a field order only the full decode takes
    for direct, undecoded in ((True, [5]), (False, [1, 2, 4, 5, 6] if kernel == "numpy" else [5])):
        codec = RawDatumCodec(shape, direct_bytes=1 if direct else 1 << 30, kernel=kernel)
        assert codec.direct == direct
        out, out_labels = np.zeros_like(images), np.full(7, -1, np.int64)
        todo = codec.decode_batch([memoryview(v) for v in values], out, out_labels)
        assert todo == undecoded
        for j in todo:
            out_labels[j] = codec.decode_into(values[j], out[j])
        assert np.array_equal(out, images) and out_labels.tolist() == labels
        for j, value in enumerate(values):
            image, label = datum_to_image(decode_datum(value))
            assert np.array_equal(image, out[j]) and label == out_labels[j]


def test_large_records_read_exactly_in_both_formats_and_into_a_reused_batch(big):
    out, images, labels = big
    lm = LmdbReader(out / "train.lmdb", keys=[datum_key(i) for i in range(40)], shape=SHAPE)
    h5 = Hdf5Reader(out / "train.h5")
    assert lm.codec.direct and h5._direct
    batch = np.empty((9, *SHAPE), np.uint8)
    for indices in (np.array([39, 0, 17, 17, 5, 38, 1, 2, 3]), np.arange(9) + 30):
        for reader in (lm, h5):
            got, got_labels = reader.read(indices, out=batch)
            assert got is batch
            assert np.array_equal(got, images[indices]) and np.array_equal(got_labels, labels[indices])
            fresh, _ = reader.read(indices)
            assert fresh is not batch and np.array_equal(fresh, images[indices])
    with pytest.raises(ValueError, match="out must be"):
        lm.read(np.arange(3), out=batch)
    lm.close()
    h5.close()


def test_page_walk_finds_every_record_where_lmdb_put_it(big):
    out, _, _ = big
    mdb = out / "train.lmdb" / "data.mdb"
    raw = mdb.read_bytes()
    spans = list(record_spans(mdb))
    assert [s.key for s in spans] == [datum_key(i) for i in range(40)]
    for key, value in iter_lmdb(out / "train.lmdb"):
        at = raw.find(value)
        assert at >= 0 and spans[int(key)].end == at + len(value)
    assert lost_records(mdb) is None


def test_truncated_data_mdb_names_the_first_lost_key_and_the_byte_counts(big, tmp_path):
    out, _, _ = big
    env = tmp_path / "train.lmdb"
    env.mkdir()
    raw = (out / "train.lmdb" / "data.mdb").read_bytes()
    ends = {}
    for key, value in iter_lmdb(out / "train.lmdb"):
        ends[key.decode()] = raw.find(value) + len(value)
    cut = ends["00000031"] - 100  # inside record 31's pixels
    expected = min((k for k, end in ends.items() if end > cut), key=int)
    (env / "data.mdb").write_bytes(raw[:cut])
    message = (rf"data.mdb is truncated: {cut} bytes but its pages need {len(raw)}; "
               rf"record key {expected} needs bytes up to {ends[expected]}")
    with pytest.raises(FirescaleError, match=message):
        LmdbReader(env)
    with pytest.raises(FirescaleError, match=rf"record key {expected} .*records or tree pages lie past the end"):
        list(iter_lmdb(env))


def test_corrupted_leaf_page_names_the_key_being_read(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (400, 4, 4, 1), dtype=np.uint8)
    with LmdbWriter(tmp_path / "small.lmdb", estimated_bytes=1 << 20) as writer:
        for i, image in enumerate(images):
            writer.put_image(i, image, i % 3)
    mdb = tmp_path / "small.lmdb" / "data.mdb"
    raw = bytearray(mdb.read_bytes())
    env = lmdb.open(str(tmp_path / "small.lmdb"), readonly=True, lock=False)
    with env.begin() as txn:
        value = txn.get(b"00000321")
    env.close()
    psize = 4096
    page = raw.find(value) // psize
    assert page > 2 and raw.find(value, raw.find(value) + 1) < 0
    # the LMDB lookups (the value index, built at open, would read the unchanged record bytes)
    reader = LmdbReader(tmp_path / "small.lmdb", index=False)  # reads key 0, on another leaf page
    raw[page * psize + 10:page * psize + 12] = b"\x00\x00"  # the leaf page's flags: neither branch nor leaf
    mdb.write_bytes(bytes(raw))
    with pytest.raises(FirescaleError, match=r"small.lmdb/data.mdb record key 00000321 cannot be read: LMDB reports"):
        reader.read(np.array([0, 321]))
    reader.close()
    # a cursor stepping onto the page would abort inside LMDB: the walk with plain reads reports it first
    with pytest.raises(FirescaleError, match=r"small.lmdb/data.mdb cannot be read from record key 00000[23]\d\d on: "
                                             rf"tree page {page} has flags 0x0, neither a branch nor a leaf "
                                             "page's; the file is corrupt"):
        list(iter_lmdb(tmp_path / "small.lmdb"))
    with pytest.raises(FirescaleError, match=rf"tree page {page} has flags 0x0, neither"):
        LmdbReader(tmp_path / "small.lmdb")


def test_hdf5_file_cut_short_after_open_names_record_and_bytes(big, tmp_path):
    out, _, _ = big
    copy = tmp_path / "train.h5"
    copy.write_bytes((out / "train.h5").read_bytes())
    reader = Hdf5Reader(copy)
    reader.read(np.array([0]))
    offsets = reader._chunk_table()
    last = int(np.argmax(offsets))
    os.truncate(copy, int(offsets[last]) + 10)
    with pytest.raises(FirescaleError, match=rf"train.h5 record {last}: its chunk needs bytes {offsets[last]}\.\."
                                             rf"{offsets[last] + 5760} but the file has {offsets[last] + 10} bytes"):
        reader.read(np.array([1, last]))
    reader.close()


def test_small_hdf5_records_gather_exactly_and_a_file_cut_before_the_first_read_is_named(tmp_path):
    rng = np.random.default_rng(8)
    images = rng.integers(0, 256, (300, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, 300)
    path = tmp_path / "train.h5"
    write_hdf5(path, images, labels, [str(k) for k in range(10)])
    reader = Hdf5Reader(path)
    assert reader._direct
    batch = np.empty((6, 8, 8, 1), np.uint8)
    for indices in (np.array([299, 0, 150, 150, 7, 298]), np.arange(6) + 100):
        got, got_labels = reader.read(indices, out=batch)
        assert got is batch and np.array_equal(got, images[indices]) and np.array_equal(got_labels, labels[indices])
    offsets = reader._chunk_table()
    reader.close()

    reader = Hdf5Reader(path)  # the map is made at the first read, here of a file already cut short
    size = path.stat().st_size
    last = int(np.argmax(offsets))
    os.truncate(path, int(offsets[last]) + 3)
    assert np.array_equal(reader.read(np.array([0, 5]))[0], images[[0, 5]])  # records before the cut still read
    with pytest.raises(FirescaleError, match=rf"train.h5 record {last}: its chunk needs bytes {offsets[last]}\.\."
                                             rf"{offsets[last] + 64} but the file has {offsets[last] + 3} bytes"):
        reader.read(np.array([3, last, 4]))
    os.truncate(path, size)  # grown again: the map still ends at the cut
    with pytest.raises(FirescaleError, match=rf"record {last}: .* but the file had {offsets[last] + 3} bytes when "
                                             "opened; it has changed since"):
        reader.read(np.array([last]))
    reader.close()


@pytest.mark.parametrize("shape", [(5, 3, 1), (48, 40, 3)])
def test_hdf5_c_gather_equals_numpy_copies_with_duplicates_and_a_reused_batch(tmp_path, monkeypatch, shape):
    from firescale.caffe.pixels import PIXELS_KERNEL
    from firescale.data import hdf5_io

    if PIXELS_KERNEL != "c":
        pytest.skip("the gather is the compiled kernel's")
    rng = np.random.default_rng(8)
    images = rng.integers(0, 256, (60, *shape), dtype=np.uint8)
    labels = rng.integers(0, 4, 60)
    write_hdf5(tmp_path / "g.h5", images, labels, [str(k) for k in range(4)])
    order = rng.integers(0, 60, 33)
    order[5] = order[20]
    reader = Hdf5Reader(tmp_path / "g.h5")
    out = np.zeros((33, *shape), np.uint8)
    got, got_labels = reader.read(order, out=out)
    assert got is out
    monkeypatch.setattr(hdf5_io, "PIXELS_KERNEL", "numpy")  # the numpy copies, for comparison
    want, want_labels = reader.read(order)
    reader.close()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, images[order])
    np.testing.assert_array_equal(got_labels, labels[order])
    np.testing.assert_array_equal(want_labels, labels[order])


def test_c_gather_refuses_rows_outside_the_source():
    from firescale.caffe.pixels import PIXELS_KERNEL, compiled_kernel

    if PIXELS_KERNEL != "c":
        pytest.skip("the gather is the compiled kernel's")
    dst = np.empty((2, 8), np.uint8)
    src = np.arange(64, dtype=np.uint8)
    compiled_kernel().gather(src, np.array([56, 3]), dst)
    np.testing.assert_array_equal(dst, [src[56:64], src[3:11]])
    with pytest.raises(ValueError, match=r"row 1 at offset 57 with 8 bytes lies outside src of 64 bytes"):
        compiled_kernel().gather(src, np.array([0, 57]), dst)
