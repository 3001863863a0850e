"""Corruption, truncation and interrupted ingests are caught, naming the file and the key."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest

from firescale.cli import main
from firescale.data.ingest import ingest
from firescale.data.manifest import verify_dataset
from firescale.data.readers import open_dataset
from firescale.data.sources import load_source
from firescale.errors import FirescaleError


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pristine")
    source = load_source("digits", test_fraction=0.2, seed=0, resize=None)
    return ingest(source, out, "digits", ["lmdb", "hdf5"], options={}).path


@pytest.fixture
def dataset(pristine, tmp_path) -> Path:
    copy = tmp_path / "digits"
    shutil.copytree(pristine, copy)
    return copy


def lmdb_value(directory: Path, key: bytes) -> bytes:
    env = lmdb.open(str(directory), readonly=True, lock=False)
    with env.begin() as txn:
        value = txn.get(key)
    env.close()
    return value


def put_value(directory: Path, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(directory), map_size=64 << 20)
    with env.begin(write=True) as txn:
        txn.put(key, value)
    env.close()


def test_flipped_byte_in_data_mdb_names_file_and_key(dataset, capsys):
    mdb = dataset / "train.lmdb" / "data.mdb"
    value = lmdb_value(dataset / "train.lmdb", b"00000321")
    raw = bytearray(mdb.read_bytes())
    at = raw.find(value)
    assert at >= 0 and raw.find(value, at + 1) < 0
    raw[at + 20] ^= 0x5A  # a pixel byte inside record 321
    mdb.write_bytes(bytes(raw))
    assert main(["data", "verify", str(dataset)]) == 1
    err = capsys.readouterr().err
    assert str(mdb) in err and "key 00000321" in err and "corrupt" in err


def test_corrupt_or_truncated_value_names_key(dataset):
    value = lmdb_value(dataset / "train.lmdb", b"00000007")
    put_value(dataset / "train.lmdb", b"00000007", value[:30])  # truncated record
    with pytest.raises(FirescaleError, match=r"train.lmdb/data.mdb record key 00000007 cannot be decoded"):
        verify_dataset(dataset)
    ds = open_dataset(dataset, "train", fmt="lmdb")
    with pytest.raises(FirescaleError, match="record key 00000007"):
        ds.read(np.array([3, 7]))
    ds.close()
    put_value(dataset / "train.lmdb", b"00000007", value[:-4] + b"\x28\x63" + value[-2:])  # label 99
    with pytest.raises(FirescaleError, match="key 00000007 has label 99"):
        verify_dataset(dataset)


def test_missing_record_names_key(dataset):
    env = lmdb.open(str(dataset / "test.lmdb"), map_size=64 << 20)
    with env.begin(write=True) as txn:
        txn.delete(b"00000100")
    env.close()
    with pytest.raises(FirescaleError, match="key 00000100 is missing"):
        verify_dataset(dataset)


def test_truncated_files(dataset):
    mdb = dataset / "train.lmdb" / "data.mdb"
    size = mdb.stat().st_size
    os.truncate(mdb, size - 8192)
    with pytest.raises(FirescaleError, match=rf"data.mdb is truncated: {size - 8192} bytes but its pages need "
                                             rf"{size}; .*key \d{{8}}"):
        verify_dataset(dataset)
    with pytest.raises(FirescaleError, match="data.mdb is truncated"):  # readers refuse too, no SIGBUS
        open_dataset(dataset, "train", fmt="lmdb")
    h5 = dataset / "test.h5"
    os.truncate(h5, h5.stat().st_size // 2)
    with pytest.raises(FirescaleError, match="test.h5"):
        open_dataset(dataset, "test", fmt="hdf5")


def test_flipped_record_in_hdf5_names_record(dataset):
    with h5py.File(dataset / "test.h5", "r+") as f:
        f["data"][42, 3, 3, 0] ^= 0xFF
    with pytest.raises(FirescaleError, match=r"test.h5 record 42 does not match its checksum"):
        verify_dataset(dataset)


def test_changed_file_outside_records_fails_the_hash(dataset):
    h5 = dataset / "train.h5"
    with h5py.File(h5, "r+") as f:
        f.attrs["note"] = "edited"
    with pytest.raises(FirescaleError, match=r"train.h5 (has SHA-256|is longer than recorded)"):
        verify_dataset(dataset)


def test_exception_mid_ingest_leaves_nothing(tmp_path):
    source = load_source("digits", test_fraction=0.2, seed=0, resize=None)

    def boom(split, index):
        if index == 500:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        ingest(source, tmp_path, "digits", ["lmdb", "hdf5"], options={}, on_record=boom)
    assert list(tmp_path.iterdir()) == []


def test_killed_ingest_never_looks_finished(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from firescale.data.ingest import ingest
        from firescale.data.sources import load_source
        def die(split, index):
            if split == "train" and index == 700:
                os.kill(os.getpid(), signal.SIGKILL)
        source = load_source("digits", test_fraction=0.2, seed=0, resize=None)
        ingest(source, {str(tmp_path)!r}, "digits", ["lmdb", "hdf5"], options={{}}, on_record=die)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "digits").exists()
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".digits.tmp-")
    with pytest.raises(FirescaleError, match="manifest.json does not exist"):
        verify_dataset(tmp_path / leftovers[0])
    # the next ingest completes, says what was left behind, and the result verifies
    assert main(["data", "ingest", "--source", "digits", "--out", str(tmp_path)]) == 0
    verify_dataset(tmp_path / "digits")
