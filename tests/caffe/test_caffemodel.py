"""Caffe's weights and solver-state files: a .caffemodel Caffe wrote, read and written back bit for bit;
V1 layers, old shapes and double blobs; HDF5; truncated and foreign files refused."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from firescale.caffe.caffemodel import (
    read_caffemodel,
    read_weights,
    write_caffemodel,
    write_caffemodel_h5,
)
from firescale.caffe.proto import FIELDS
from firescale.caffe.solverstate import CaffeSolverState, read_solverstate, write_solverstate, write_solverstate_h5
from firescale.caffe.wire import FIXED32, LENGTH_DELIMITED, VARINT, encode_varint, iter_fields, tag
from firescale.errors import FirescaleError

DATA = Path(__file__).parent / "data"
LENET = DATA / "lenet_iter_10000.caffemodel"   # written by Caffe (see data/README.md)


# ------------------------------------------------------------------ an independent reader and writer
def _raw_blobs(path: Path) -> dict[str, list[tuple[bytes, tuple[int, ...]]]]:
    """Each layer's blobs as (the packed `data` bytes, shape), decoded field by field from the wire format
    with caffe.proto's numbers (NetParameter.layer 100, LayerParameter.name 1 / blobs 7, BlobProto.data 5 /
    shape 7, BlobShape.dim 1), without the protobuf package."""
    out: dict[str, list[tuple[bytes, tuple[int, ...]]]] = {}
    for number, _, layer in iter_fields(path.read_bytes()):
        if number != 100:
            continue
        name, blobs = "", []
        for field, _, value in iter_fields(layer):
            if field == 1:
                name = bytes(value).decode()
            elif field == 7:
                data, dims = b"", ()
                for f, _, v in iter_fields(value):
                    if f == 5:
                        data += bytes(v)
                    elif f == 7:
                        for _, _, packed in iter_fields(v):
                            dims = _varints(bytes(packed))
                blobs.append((data, dims))
        out[name] = blobs
    return out


def _varints(buf: bytes) -> tuple[int, ...]:
    from firescale.caffe.wire import decode_varint

    values, pos = [], 0
    while pos < len(buf):
        value, pos = decode_varint(buf, pos)
        values.append(value)
    return tuple(values)


def _ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field, encoded here by hand rather than with the writer under test."""
    return tag(number, LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return tag(number, VARINT) + encode_varint(value)


# ------------------------------------------------------------------ the schema
def test_every_described_field_is_caffes():
    """Names, numbers, types, labels and packing against Caffe's own caffe.proto, verbatim in tests/caffe/data."""
    proto = (DATA / "caffe.proto").read_text()
    for message, fields in FIELDS.items():
        body = re.search(rf"^message {message} {{(.*?)^}}", proto, re.S | re.M)
        assert body, message
        declared = {m.group(3): (m.group(1), m.group(2), int(m.group(4)), bool(m.group(5)))
                    for m in re.finditer(r"^\s*(optional|repeated) (\w+) (\w+) = (\d+)( \[packed = true\])?",
                                         body.group(1), re.M)}
        for label, kind, name, number, packed in fields:
            assert declared[name] == (label, kind, number, packed), (message, name)


# ------------------------------------------------------------------ Caffe's own file
def test_a_caffe_written_lenet_reads_in_caffes_shapes_and_values():
    blobs = read_caffemodel(LENET)
    assert {k: [a.shape for a in v] for k, v in blobs.items() if v} == {
        "conv1": [(20, 1, 5, 5), (20,)], "conv2": [(50, 20, 5, 5), (50,)],
        "ip1": [(500, 800), (500,)], "ip2": [(10, 500), (10,)]}
    assert [k for k, v in blobs.items() if not v] == ["mnist", "pool1", "pool2", "relu1", "loss"]
    for name, raw in _raw_blobs(LENET).items():
        for array, (data, dims) in zip(blobs[name], raw):
            assert array.dtype == np.float32 and array.shape == dims
            assert array.tobytes() == data, name   # the values exactly as the independent decoder sees them


def test_a_caffe_written_file_round_trips_bit_for_bit(tmp_path):
    out = write_caffemodel(tmp_path / "again.caffemodel", read_caffemodel(LENET), "LeNet")
    theirs, ours = _raw_blobs(LENET), _raw_blobs(out)
    assert {k: v for k, v in theirs.items() if v} == {k: v for k, v in ours.items() if v}
    assert sum(len(d) for blobs in ours.values() for d, _ in blobs) == 4 * 431080  # every parameter of LeNet
    again = read_caffemodel(out)
    assert all(a.tobytes() == b.tobytes() for k, v in read_caffemodel(LENET).items() for a, b in zip(v, again[k]))


# ------------------------------------------------------------------ other writers, old forms
def test_v1_layers_old_shapes_and_double_blobs_read_as_caffe_reads_them(tmp_path):
    """A NetParameter built by hand from caffe.proto's numbers: V1 `layers` (2) with name (4) and blobs (6),
    num/channels/height/width (1-4), float `data` (5) and `double_data` (8)."""
    floats = np.array([1.5, -2.25, 3.0e-7, np.float32(np.pi)], dtype="<f4")
    doubles = np.array([0.1, -7.0], dtype="<f8")
    old = _int(1, 1) + _int(2, 1) + _int(3, 2) + _int(4, 2) + _ld(5, floats.tobytes())
    new = _ld(7, _ld(1, encode_varint(2))) + _ld(8, doubles.tobytes())
    v1 = _ld(4, b"fc") + _ld(6, old) + _ld(6, new)
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(_ld(1, b"old") + _ld(2, v1))
    blobs = read_weights(path)
    assert list(blobs) == ["fc"]
    weights, bias = blobs["fc"]
    assert weights.shape == (1, 1, 2, 2) and weights.tobytes() == floats.tobytes()
    assert bias.dtype == np.float64 and bias.tobytes() == doubles.tobytes()
    again = read_weights(write_caffemodel(tmp_path / "again.caffemodel", blobs))
    assert [a.tobytes() for a in again["fc"]] == [floats.tobytes(), doubles.tobytes()]


def test_unpacked_floats_read_too(tmp_path):
    """proto2 parsers accept a repeated float written one by one (fixed32 each), as old writers did."""
    values = np.array([0.5, 2.0], dtype="<f4")
    blob = _ld(7, _ld(1, encode_varint(2))) + b"".join(tag(5, FIXED32) + v.tobytes() for v in values)
    (tmp_path / "w.caffemodel").write_bytes(_ld(100, _ld(1, b"ip") + _ld(7, blob)))
    assert read_weights(tmp_path / "w.caffemodel")["ip"][0].tobytes() == values.tobytes()


# ------------------------------------------------------------------ bad files
@pytest.mark.parametrize("cut", [3, 200, 862503, 1725003])
def test_a_truncated_caffemodel_is_refused_naming_it(tmp_path, cut):
    path = tmp_path / "cut.caffemodel"
    path.write_bytes(LENET.read_bytes()[:cut])
    with pytest.raises(FirescaleError, match="truncated") as err:
        read_weights(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["proto text", "solver state", "empty"])
def test_a_file_of_another_kind_is_refused_naming_it(tmp_path, kind):
    path = tmp_path / "w.caffemodel"
    if kind == "proto text":
        path.write_bytes((DATA / "caffe.proto").read_bytes())
    elif kind == "solver state":
        write_solverstate(path, CaffeSolverState(7, "runs/x_iter_7.caffemodel", [np.zeros(3, np.float32)]))
    else:
        path.write_bytes(b"")
    with pytest.raises(FirescaleError) as err:
        read_weights(path)
    assert str(path) in str(err.value) and "NetParameter" in str(err.value)


def test_a_blob_shorter_than_its_shape_is_refused_naming_layer_and_blob(tmp_path):
    blob = _ld(7, _ld(1, encode_varint(2) + encode_varint(3))) + _ld(5, np.zeros(5, "<f4").tobytes())
    (tmp_path / "w.caffemodel").write_bytes(_ld(100, _ld(1, b"conv1") + _ld(7, blob)))
    with pytest.raises(FirescaleError, match=r"layer 'conv1' blob 0 holds 5 values but its shape \(2, 3\) needs 6"):
        read_weights(tmp_path / "w.caffemodel")


def test_a_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "w.caffemodel"
    with pytest.raises(ValueError, match="float32 or float64"):
        write_caffemodel(path, {"conv1": [np.zeros(3, np.float32), np.zeros(2, np.int32)]})
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ HDF5 and the solver state
def test_hdf5_weights_in_caffes_layout_round_trip(tmp_path):
    import h5py

    blobs = {**read_caffemodel(LENET), "inception_3a/1x1": [np.arange(6, dtype=np.float32).reshape(3, 2)]}
    path = write_caffemodel_h5(tmp_path / "w.caffemodel.h5", blobs)
    with h5py.File(path, "r") as fh:   # Net::ToHDF5: data/<layer>/<blob index>
        assert fh["data/conv1/0"].shape == (20, 1, 5, 5) and fh["data/conv1/0"].dtype == np.float32
        assert len(fh["data/pool1"]) == 0 and fh["data/inception_3a/1x1/0"].shape == (3, 2)
    again = read_weights(path)
    assert again.keys() == blobs.keys()
    assert all(a.tobytes() == b.tobytes() for k, v in blobs.items() for a, b in zip(v, again[k]))


@pytest.mark.parametrize("writer", [write_solverstate, write_solverstate_h5])
def test_solver_state_round_trips_in_both_formats(tmp_path, writer):
    history = [np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32), np.ones(4, np.float32)]
    path = writer(tmp_path / "s.solverstate", CaffeSolverState(1200, "snapshots/x_iter_1200.caffemodel", history, 2))
    state = read_solverstate(path)
    assert (state.iter, state.learned_net, state.current_step) == (1200, "snapshots/x_iter_1200.caffemodel", 2)
    assert [h.tobytes() for h in state.history] == [h.tobytes() for h in history]


def test_hdf5_solver_state_has_caffes_datasets(tmp_path):
    import h5py

    path = write_solverstate_h5(tmp_path / "s.solverstate.h5", CaffeSolverState(9, "m.caffemodel.h5", [np.ones(2)]))
    with h5py.File(path, "r") as fh:  # hdf5_save_int: 1-D int32 of one; hdf5_save_string: a scalar string
        assert fh["iter"].shape == (1,) and fh["iter"].dtype == np.int32 and fh["iter"][0] == 9
        assert fh["learned_net"][()] == b"m.caffemodel.h5" and fh["current_step"][0] == 0
        assert list(fh["history"]) == ["0"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_blob_written_with_packed_raw_values_is_the_message_protobuf_writes(dtype):
    from firescale.caffe.caffemodel import blob_bytes
    from firescale.caffe.proto import BlobProto

    array = np.random.default_rng(0).standard_normal((3, 1, 2)).astype(dtype)
    theirs = BlobProto()
    theirs.shape.dim.extend([3, 1, 2])
    (theirs.data if dtype == np.float32 else theirs.double_data).extend(array.ravel().tolist())
    assert BlobProto.FromString(blob_bytes(array)) == theirs
