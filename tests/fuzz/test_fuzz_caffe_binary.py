"""Fuzzing the readers of Caffe's binary files: weights (.caffemodel and .caffemodel.h5, read and matched to
LeNet as `train --weights` does), solver states (.solverstate, binary and HDF5, as a resume reads them), mean
images (.binaryproto and .npy) and Datum records decoded a batch at a time (the compiled kernel's path and
NumPy's).  The weights are Caffe's own LeNet (tests/caffe/data); the other files are written from it as Caffe
writes them.  HDF5 files are read in a forked child, so that a fault inside libhdf5 fails the example, not the
run."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from fuzzing import REPO, budget, read_or_refuse, scratch_file, trial
from hypothesis import given
from hypothesis import strategies as st
from mutate import any_bytes, mutated_bytes, protobuf_offsets

from firescale.bench.damage import classify, run_in_child
from firescale.caffe.caffemodel import read_caffemodel, read_weights, write_caffemodel_h5
from firescale.caffe.datum import DatumError, RawDatumCodec, encode_datum, image_to_datum
from firescale.caffe.pixels import PIXELS_KERNEL
from firescale.caffe.solverstate import CaffeSolverState, read_solverstate, write_solverstate, write_solverstate_h5

pytestmark = pytest.mark.fuzz

CAFFEMODEL = REPO / "tests" / "caffe" / "data" / "lenet_iter_10000.caffemodel"
WEIGHTS = CAFFEMODEL.read_bytes()
WEIGHT_FIELDS = protobuf_offsets(WEIGHTS)
BLOBS = read_caffemodel(CAFFEMODEL)


def _written(write, *args) -> bytes:
    path = scratch_file("written", b"", "base")
    write(path, *args)
    return path.read_bytes()


def _small_history() -> list[np.ndarray]:
    """LeNet's blobs but ip1's 400,000 weights: the solver state's structure in 100 KB, not 1.7 MB."""
    return [a for name, arrays in BLOBS.items() for a in arrays if a.size < 100_000]


WEIGHTS_H5 = _written(write_caffemodel_h5, {"conv1": BLOBS["conv1"], "ip2": BLOBS["ip2"]})
STATE = CaffeSolverState(10000, "examples/mnist/lenet_iter_10000.caffemodel", _small_history(), 3)
SOLVERSTATE = _written(write_solverstate, STATE)
SOLVERSTATE_FIELDS = protobuf_offsets(SOLVERSTATE)
SOLVERSTATE_H5 = _written(write_solverstate_h5, CaffeSolverState(STATE.iter, STATE.learned_net, STATE.history[:3], 3))
# HDF5's structure (superblock, object headers, B-trees, heaps) lies in its first pages and around each dataset.
HDF5_HOT = tuple(range(0, 2048, 8))


def lenet():
    from firescale.nets.zoo import get_net

    return get_net("lenet", num_classes=10, input_shape=(28, 28, 1))


def check_weights(path: Path) -> str:
    """The weights as `train --weights` reads them: every blob, then matched to LeNet's layers."""
    from firescale.train.caffe_weights import net_from_caffe

    blobs = read_weights(path)
    assert all(isinstance(a, np.ndarray) for arrays in blobs.values() for a in arrays)
    copied = net_from_caffe(lenet(), blobs, path)
    return f"{len(copied.copied)} layers"


def check_state(path: Path) -> str:
    state = read_solverstate(path)
    assert isinstance(state.iter, int) and isinstance(state.learned_net, str)
    assert all(isinstance(h, np.ndarray) for h in state.history)
    return f"iteration {state.iter}"


def in_child(target: str, read, path: Path) -> None:
    """`read(path)` in a forked child: it reads, or stops with one sentence naming `path`."""
    with trial(target):
        status, output = run_in_child(lambda: read(path), timeout=20)   # below the alarm (fuzzing.HANG_S)
    outcome, message = classify(status, output, path)
    assert outcome in ("read", "stopped"), f"{outcome}: {message}"


# ---------------------------------------------------------------- weights

@budget(100)
@given(any_bytes(WEIGHTS, WEIGHT_FIELDS))
def test_a_damaged_caffemodel_is_read_or_refused_in_one_sentence(raw):
    path = scratch_file("lenet_iter_10000.caffemodel", raw.data, "weights")
    with trial(".caffemodel"):
        read_or_refuse(lambda: check_weights(path), path)


@budget(60)
@given(any_bytes(WEIGHTS_H5, HDF5_HOT))
def test_a_damaged_caffemodel_h5_is_read_or_refused_in_one_sentence(raw):
    in_child(".caffemodel.h5", check_weights, scratch_file("lenet.caffemodel.h5", raw.data, "weights"))


# ---------------------------------------------------------------- solver states

@budget(100)
@given(any_bytes(SOLVERSTATE, SOLVERSTATE_FIELDS))
def test_a_damaged_solverstate_is_read_or_refused_in_one_sentence(raw):
    path = scratch_file("lenet_iter_10000.solverstate", raw.data, "states")
    with trial(".solverstate"):
        read_or_refuse(lambda: check_state(path), path)


@budget(60)
@given(any_bytes(SOLVERSTATE_H5, HDF5_HOT))
def test_a_damaged_solverstate_h5_is_read_or_refused_in_one_sentence(raw):
    in_child(".solverstate.h5", check_state, scratch_file("lenet_iter_10000.solverstate.h5", raw.data, "states"))


# ---------------------------------------------------------------- mean images

def _binaryproto(mean: np.ndarray) -> bytes:
    """compute_image_mean's file: a BlobProto of (1, C, H, W) float32 in BGR."""
    from firescale.caffe.proto import BlobProto

    planar = mean[:, :, ::-1].transpose(2, 0, 1)
    blob = BlobProto(num=1, channels=planar.shape[0], height=planar.shape[1], width=planar.shape[2])
    blob.data.extend(planar.reshape(-1).tolist())
    return blob.SerializeToString()


MEAN = np.random.default_rng(0).random((4, 4, 3), np.float32) * 255
MEAN_PROTO = _binaryproto(MEAN)
_npy = io.BytesIO()
np.save(_npy, MEAN)
MEAN_NPY = _npy.getvalue()


@budget(100)
@given(st.sampled_from(["mean.binaryproto", "mean.npy"]), st.data())
def test_a_damaged_mean_file_is_read_or_refused_in_one_sentence(name, data):
    from firescale.data.transforms import load_mean

    base = MEAN_PROTO if name.endswith(".binaryproto") else MEAN_NPY
    raw = data.draw(any_bytes(base, protobuf_offsets(base) if name.endswith(".binaryproto") else range(0, 128, 4)))
    path = scratch_file(name, raw.data, "means")
    with trial("mean file"):
        mean = read_or_refuse(lambda: load_mean(str(path), (4, 4, 3)), path)
    if mean is not None:
        assert mean.dtype == np.float32 and mean.shape in ((4, 4, 3), (1, 1, 3))


def test_the_mean_files_read_as_written():
    from firescale.data.transforms import load_mean

    for name, raw in (("mean.binaryproto", MEAN_PROTO), ("mean.npy", MEAN_NPY)):
        assert np.allclose(load_mean(str(scratch_file(name, raw, "means")), (4, 4, 3)), MEAN)


# ---------------------------------------------------------------- Datum records, a batch at a time

SHAPES = [(3, 3, 1), (2, 5, 3), (8, 8, 1), (17, 3, 3), (4, 4, 4)]


@budget(150)
@given(st.sampled_from(SHAPES), st.lists(st.tuples(st.integers(0, 255), st.integers(-3, 2**31 - 1)), min_size=1,
                                         max_size=6), st.data())
def test_a_batch_of_damaged_datums_decodes_as_each_alone_or_is_a_datum_error(shape, seeds, data):
    """The batch decode (the compiled kernel's decode_raw_datums, or NumPy's joined and direct paths) leaves every
    record it does not decode to `decode_into`, which decodes it or raises DatumError; a record the batch decodes
    is the one `decode_into` gives."""
    values = []
    for fill, label in seeds:
        image = ((np.arange(np.prod(shape)) * 7 + fill) % 256).astype(np.uint8).reshape(shape)
        good = encode_datum(image_to_datum(image, label))
        values.append(data.draw(st.one_of(st.just(good), mutated_bytes(good, (0, 2, 4, 6, len(good) - 4)).map(
            lambda m: m.data))))
    kernels = ["numpy", "c"] if PIXELS_KERNEL == "c" else ["numpy"]
    with trial("Datum batch"):
        for kernel in kernels:
            for direct in (1, 1 << 30):
                codec = RawDatumCodec(shape, kernel=kernel, direct_bytes=direct)
                images = np.zeros((len(values), *shape), np.uint8)
                labels = np.full(len(values), -99, np.int64)
                rest = codec.decode_batch(values, images, labels)
                for j, value in enumerate(values):
                    one = np.zeros(shape, np.uint8)
                    try:
                        label = codec.decode_into(value, one)
                    except DatumError:
                        assert j in rest, (kernel, j)
                        continue
                    if j not in rest:
                        assert labels[j] == label and np.array_equal(images[j], one), (kernel, direct, j)
