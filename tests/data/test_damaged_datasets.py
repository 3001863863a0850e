"""Damaged datasets: whatever bytes a file holds, the training and test readers read it or stop with one
sentence naming the file and the record; never a signal, a traceback or a hang (issue 53).

Each read runs in a forked child (firescale.bench.damage), so a SIGBUS or an abort inside LMDB fails the
test instead of ending pytest.  The regression cases are damages that, before the LMDB tree was checked
with plain reads and h5py's errors were named, killed the reader or escaped it as tracebacks.
"""
from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

from firescale.bench.damage import classify, run_child, sweep, write_caffe_hdf5
from firescale.caffe.datum import RawDatumCodec, datum_key, encode_datum, image_to_datum
from firescale.data.ingest import ingest
from firescale.data.lmdb_io import LmdbReader, LmdbWriter
from firescale.data.sources import load_source
from firescale.errors import FirescaleError

PSIZE = 4096


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pristine")
    source = load_source("digits", test_fraction=0.2, seed=0, resize=None)
    path = ingest(source, out, "digits", ["lmdb", "hdf5"], options={}).path
    write_caffe_hdf5(path)
    return path


def test_a_seeded_sweep_of_damaged_copies_reads_or_stops_with_a_sentence(pristine, tmp_path):
    result = sweep(pristine, tmp_path, 40, seed=53, timeout=60)
    failures = [f"{t.outcome}: {t.damage}: {t.message}" for t in result.failures]
    assert not failures, "\n".join(failures)
    counts = result.counts
    assert counts["read"] + counts["stopped"] == 40 and counts["stopped"] >= 10  # the damages do bite


def read_damaged(copy: Path, target: str, damaged: Path) -> str:
    """The sentence a child reading the copy stopped with; any other end fails the test."""
    status, output = run_child(copy, target, "train", timeout=60)
    outcome, message = classify(status, output, damaged)
    assert outcome == "stopped", f"{outcome}: {message}"
    return message


# Pages of train.lmdb/data.mdb: the meta page in use, the root, the first leaf, the nodes of a page.

def meta_offset(raw: bytearray) -> int:
    txnids = [struct.unpack_from("<Q", raw, n * PSIZE + 144)[0] for n in (0, 1)]
    return PSIZE if txnids[1] > txnids[0] else 0


def root(raw: bytearray) -> int:
    return struct.unpack_from("<Q", raw, meta_offset(raw) + 128)[0]


def nodes(raw: bytearray, pgno: int) -> tuple[int, ...]:
    lower = struct.unpack_from("<H", raw, pgno * PSIZE + 12)[0]
    return tuple(pgno * PSIZE + p for p in struct.unpack_from(f"<{(lower - 16) // 2}H", raw, pgno * PSIZE + 16))


def first_leaf(raw: bytearray) -> int:
    pgno = root(raw)
    while struct.unpack_from("<H", raw, pgno * PSIZE + 10)[0] & 0x01:
        lo, hi, top = struct.unpack_from("<3H", raw, nodes(raw, pgno)[0])
        pgno = lo | hi << 16 | top << 32
    return pgno


def one_key_in_the_root(raw):  # LMDB asserted NUMKEYS > 1 on a branch page: SIGABRT
    struct.pack_into("<H", raw, root(raw) * PSIZE + 12, 18)


def a_record_of_two_gigabytes(raw):  # two bytes of record 0's size: LMDB hands out bytes past the file
    raw[nodes(raw, first_leaf(raw))[0] + 2:nodes(raw, first_leaf(raw))[0] + 4] = b"\x7f\x7f"


def an_empty_first_leaf(raw):  # read as if the leaf's records did not exist
    struct.pack_into("<H", raw, first_leaf(raw) * PSIZE + 12, 16)


def the_root_is_a_meta_page(raw):  # LMDB asserted root > 1
    struct.pack_into("<Q", raw, meta_offset(raw) + 128, 1)


def a_child_that_is_its_parent(raw):  # a cycle: LMDB ran its cursor stack full
    pgno = root(raw)
    struct.pack_into("<3H", raw, nodes(raw, pgno)[1], pgno & 0xFFFF, pgno >> 16, 0)


def a_key_past_its_page(raw):  # key size 65535: a key that is not UTF-8 escaped as UnicodeDecodeError
    at = nodes(raw, first_leaf(raw))[3]
    raw[at + 6:at + 8] = b"\xff\xff"


def a_branch_key_as_long_as_its_page(raw):  # the key took the page's bytes, newlines too, into the message
    at = nodes(raw, root(raw))[1]
    struct.pack_into("<H", raw, at + 6, (at // PSIZE + 1) * PSIZE - at - 8)


def a_last_child_dropped(raw):  # every page still valid, the root's last subtree silently gone
    struct.pack_into("<H", raw, root(raw) * PSIZE + 12, struct.unpack_from("<H", raw, root(raw) * PSIZE + 12)[0] - 2)


@pytest.mark.parametrize("target", ["lmdb", "caffe-lmdb"])
@pytest.mark.parametrize("damage, sentence", [
    (one_key_in_the_root, r"cannot be read from the first record on: tree page \d+ has a header giving 1 nodes"),
    (a_record_of_two_gigabytes, r"from the first record on: tree page \d+ has record 00000000 of \d+ bytes running "
                                "past the page; the file is corrupt"),
    (an_empty_first_leaf, r"tree page \d+ has a header giving 0 nodes"),
    (the_root_is_a_meta_page, r"is not the LMDB environment of a dataset: the meta page gives root page 1; allowed "
                              r"are pages 2\.\.\d+"),
    (a_child_that_is_its_parent, r"from record key \d{8} on: tree page \d+ is named twice in the tree"),
    (a_key_past_its_page, r"tree page \d+ holds node 3 with a key out of order or past the page"),
    (a_branch_key_as_long_as_its_page, r"from record key \d{8}(\\x[0-9a-f]{2})+ on: tree page \d+ holds node 0 "),
    (a_last_child_dropped, r"the tree holds \d+ records but the meta page counts 1438"),
])
def test_damaged_lmdb_tree_is_named_before_lmdb_maps_it(pristine, tmp_path, target, damage, sentence):
    copy = tmp_path / "copy"
    shutil.copytree(pristine, copy)
    mdb = copy / "train.lmdb" / "data.mdb"
    raw = bytearray(mdb.read_bytes())
    damage(raw)
    mdb.write_bytes(bytes(raw))
    message = read_damaged(copy, target, mdb)
    assert message.startswith(str(mdb)) and re.search(sentence, message), message


def test_label_varint_past_the_records_end_names_the_key(tmp_path):
    """Raw Datums laid out as Caffe writes them up to a label varint cut short: once a WireError."""
    shape = (3, 3, 1)
    images = np.random.default_rng(0).integers(0, 256, (20, *shape), dtype=np.uint8)
    with LmdbWriter(tmp_path / "v.lmdb", estimated_bytes=1 << 20) as writer:
        for i, image in enumerate(images):
            value = encode_datum(image_to_datum(image, 300 if i == 7 else 1))
            writer.put(datum_key(i), value[:-3] if i == 7 else value)  # 0x28, then a varint 0xAC cut short
    value = encode_datum(image_to_datum(images[7], 300))[:-3]
    codec = RawDatumCodec(shape)
    assert value[len(codec.header) + codec.size:] == b"\x28\xac"
    reader = LmdbReader(tmp_path / "v.lmdb")
    with pytest.raises(FirescaleError, match=r"v.lmdb/data.mdb record key 00000007: varint runs past the end"):
        reader.read(np.array([6, 7]))
    reader.close()
    reader = LmdbReader(tmp_path / "v.lmdb", index=False)
    with pytest.raises(FirescaleError, match=r"record key 00000007: varint runs past the end"):
        reader.read(np.array([7]))
    reader.close()


@pytest.mark.parametrize("what, sentence", [
    ("zero the chunk index", r"train.h5 the chunk index of /data cannot be read: HDF5 reports .*; the file is damaged"),
    ("label out of range", r"train.h5 record 5 has label 1099511627776; allowed are whole numbers 0\.\.9"),
    ("attribute damaged", r"train.h5 attribute layout cannot be read: HDF5 reports .*; the file is damaged"),
])
def test_damaged_hdf5_is_named_not_raised_by_h5py(pristine, tmp_path, what, sentence):
    copy = tmp_path / "copy"
    shutil.copytree(pristine, copy)
    h5 = copy / "train.h5"
    if what == "label out of range":
        with h5py.File(h5, "r+") as f:
            f["label"][5] = 1 << 40
    else:
        raw = bytearray(h5.read_bytes())
        if what == "zero the chunk index":
            raw[4096:8192] = bytes(4096)  # the fixed array of chunk addresses (checksummed) lies here
        else:
            at = raw.find(b"firescale-hdf5")
            raw[at - 40:at] = bytes(40)  # the layout attribute's header
        h5.write_bytes(bytes(raw))
    message = read_damaged(copy, "hdf5", h5)
    assert re.search(sentence, message), message


def test_a_label_outside_the_manifests_classes_names_the_key(pristine, tmp_path):
    """A damaged label varint that still decodes (99 of 10 classes) once reached the trainer's loss."""
    import lmdb

    from firescale.data.readers import open_dataset

    copy = tmp_path / "copy"
    shutil.copytree(pristine, copy)
    env = lmdb.open(str(copy / "train.lmdb"), map_size=64 << 20)
    with env.begin(write=True) as txn:
        value = txn.get(b"00000007")
        txn.put(b"00000007", value[:-4] + b"\x28\x63" + value[-2:])
    env.close()
    ds = open_dataset(copy, "train", fmt="lmdb")
    with pytest.raises(FirescaleError, match=r"train.lmdb/data.mdb record key 00000007 has label 99; the dataset's "
                                             r"10 classes are 0\.\.9"):
        ds.read(np.arange(10))
    ds.close()
