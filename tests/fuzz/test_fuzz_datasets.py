"""Fuzzing the dataset readers with damaged files: our LMDB and HDF5 datasets (through their folder and its
manifest), a bare LMDB as Caffe's convert_imageset writes it, Caffe's HDF5Data list of float files, the
manifest itself, and LMDB records that are damaged Datums.  Each copy of a small dataset (scikit-learn's digits,
ingested as `data ingest` does) has one file changed where its format keeps its structure, and is read through
the training reader (an epoch of shuffled batches) and the test reader, and verified, in a forked child
(firescale.bench.damage): it reads, or stops with one sentence naming the dataset's file, never a signal, a
traceback or a hang.  tests/data/test_damaged_datasets.py sweeps seeded random damages of the same kind; this
tier draws them with hypothesis and aims them at the pages, nodes and headers."""
from __future__ import annotations

import json
import os
import resource
import shutil
from pathlib import Path

import numpy as np
import pytest
from fuzzing import budget, scratch_file, trial
from hypothesis import given
from hypothesis import strategies as st
from mutate import hdf5_offsets, lmdb_offsets, mutated_bytes, mutated_text, mutated_tree, tree_words

from firescale.bench.damage import classify, read_through, run_in_child, target_files, write_caffe_hdf5

pytestmark = pytest.mark.fuzz

TARGETS = ("lmdb", "hdf5", "caffe-lmdb", "caffe-hdf5")
TIMEOUT = 20   # seconds a reading child may take (below the example's alarm, fuzzing.HANG_S)
MEMORY = 4 << 30   # bytes of address space a reading child may take


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    from firescale.data.ingest import ingest
    from firescale.data.sources import load_source

    out = tmp_path_factory.mktemp("pristine")
    source = load_source("digits", test_fraction=0.2, seed=0, resize=None)
    path = ingest(source, out, "digits", ["lmdb", "hdf5"], options={}).path
    write_caffe_hdf5(path)
    return path


@pytest.fixture(scope="module")
def originals(pristine) -> dict[str, tuple[bytes, list[int]]]:
    """Each file a damage may hit: its bytes and where its format's structure lies."""
    found = {}
    for target in TARGETS:
        for split in ("train", "test"):
            for rel in target_files(target, split):
                raw = (pristine / rel).read_bytes()
                found[rel] = (raw, lmdb_offsets(raw) if rel.endswith(".mdb") else hdf5_offsets(raw))
    return found


def fresh_copy(pristine: Path) -> Path:
    copy = scratch_file("x", b"", "datasets").parent / "copy"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(pristine, copy)
    return copy


def read_in_child(target: str, read, named: Path) -> None:
    """`read()` in a forked child, its memory capped (a count a damage makes huge must not take the machine's):
    it reads, or stops with one sentence naming `named` (a file, or the folder)."""
    def capped():
        if not os.environ.get("FIRESCALE_FUZZ_ASAN_KERNEL"):   # under ASan, its hard_rss_limit_mb (make fuzz)
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
        return read()

    with trial(target):
        status, output = run_in_child(capped, TIMEOUT)
    outcome, message = classify(status, output, named)
    assert outcome in ("read", "stopped"), f"{outcome}: {message}"


def read_and_verify(copy: Path, target: str, split: str) -> str:
    """Both readers over one split, then (for our folder) `data verify`'s check of every file and record."""
    from firescale.data.manifest import verify_dataset

    records = read_through(copy, target, split)
    if target in ("lmdb", "hdf5"):
        verify_dataset(copy)
    return f"{records} records"


@budget(150)
@given(st.sampled_from(TARGETS), st.sampled_from(("train", "test")), st.data())
def test_a_damaged_dataset_file_reads_or_stops_in_one_sentence(pristine, originals, target, split, data):
    rel = data.draw(st.sampled_from(target_files(target, split)))
    base, hot = originals[rel]
    damage = data.draw(mutated_bytes(base, hot))
    copy = fresh_copy(pristine)
    (copy / rel).write_bytes(damage.data)
    read_in_child(f"dataset {target}", lambda: read_and_verify(copy, target, split), copy / rel)


# ---------------------------------------------------------------- the manifest

@budget(100)
@given(st.sampled_from(("lmdb", "hdf5")), st.sampled_from(("train", "test")), st.booleans(), st.data())
def test_a_damaged_manifest_reads_or_stops_in_one_sentence(pristine, fmt, split, as_tree, data):
    text = (pristine / "manifest.json").read_text()
    tree = json.loads(text)
    if as_tree:
        changed = json.dumps(data.draw(mutated_tree(tree, tree_words(tree) + ["records", "shape", "splits"])))
    else:
        changed = data.draw(mutated_text(text, tree_words(tree)))
    copy = fresh_copy(pristine)
    (copy / "manifest.json").write_text(changed, errors="surrogateescape")
    read_in_child("manifest", lambda: read_and_verify(copy, fmt, split), copy)


# ---------------------------------------------------------------- damaged Datums in a Caffe LMDB

@budget(80)
@given(st.sampled_from([(8, 8, 1), (5, 7, 3)]), st.lists(st.integers(0, 19), min_size=1, max_size=4, unique=True),
       st.data())
def test_an_lmdb_of_damaged_datums_reads_or_stops_naming_the_record(shape, damaged, data):
    """A Caffe LMDB of 20 raw Datums, some of them changed: the reader decodes each, or names the record."""
    from firescale.caffe.datum import datum_key, encode_datum, image_to_datum
    from firescale.data.lmdb_io import LmdbWriter

    folder = scratch_file("x", b"", "datums").parent / "train.lmdb"
    if folder.exists():
        shutil.rmtree(folder)
    rng = np.random.default_rng(len(damaged))
    with LmdbWriter(folder, estimated_bytes=1 << 20) as writer:
        for i in range(20):
            value = encode_datum(image_to_datum(rng.integers(0, 256, shape, dtype=np.uint8), i % 10))
            if i in damaged:
                value = data.draw(mutated_bytes(value, (0, 2, 4, 6, 8, len(value) - 4, len(value) - 2))).data
            writer.put(datum_key(i), value)
    read_in_child("Datum in an LMDB", lambda: f"{read_through(folder.parent, 'caffe-lmdb', 'train')} records",
                  folder / "data.mdb")


# ---------------------------------------------------------------- Caffe's HDF5Data list file

@budget(60)
@given(st.sampled_from(("train", "test")), st.data())
def test_a_changed_caffe_hdf5_list_reads_or_stops_in_one_sentence(pristine, split, data):
    """The text file HDF5Data reads (one .h5 path a line): its lines changed, doubled, pointing elsewhere."""
    from firescale.bench.damage import CAFFE_LIST

    name = f"{split}_{CAFFE_LIST}"
    words = ["caffe_train_0.h5", "caffe_test_1.h5", "train.h5", "train.lmdb", "manifest.json", "missing.h5", "/",
             "..", ".", "\x00", "/dev/null", "/proc/self/mem"]
    text = data.draw(mutated_text((pristine / name).read_text(), words))
    copy = fresh_copy(pristine)
    (copy / name).write_text(text, errors="surrogateescape")
    read_in_child("Caffe HDF5 list", lambda: f"{read_through(copy, 'caffe-hdf5', split)} records", copy / name)
