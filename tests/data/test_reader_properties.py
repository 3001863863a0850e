"""Properties of the readers of a user's dataset files, over bytes hypothesis draws: a damaged Datum is a
DatumError, a damaged data.mdb a LayoutError whose index never points outside the file (issue 53)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firescale.caffe.datum import DatumError, RawDatumCodec, datum_to_image, decode_datum, encode_datum, image_to_datum
from firescale.data.labels import check_labels
from firescale.data.lmdb_io import LmdbWriter
from firescale.data.lmdb_pages import LayoutError, value_index
from firescale.errors import FirescaleError

SHAPE = (3, 3, 1)
GOOD = encode_datum(image_to_datum(np.arange(9, dtype=np.uint8).reshape(SHAPE), 7))
BOUNDED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def mutated(base: bytes, data: st.DataObject) -> bytes:
    """`base` with a few bytes changed, cut short or grown, as a damaged file holds it."""
    raw = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    return bytes(raw[:cut]) + data.draw(st.binary(max_size=4))


@BOUNDED
@given(st.data())
def test_a_damaged_datum_decodes_or_is_a_datum_error(data):
    value = mutated(GOOD, data)
    out = np.empty(SHAPE, np.uint8)
    for decode in (lambda v: datum_to_image(decode_datum(v)), lambda v: RawDatumCodec(SHAPE).decode_into(v, out)):
        try:
            decode(value)
        except DatumError:
            pass


@BOUNDED
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_are_a_datum_error(value):
    try:
        datum_to_image(decode_datum(value))
    except DatumError:
        pass


@pytest.fixture(scope="module")
def data_mdb(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("lmdb") / "p.lmdb"
    images = np.random.default_rng(0).integers(0, 256, (300, 48, 48, 1), dtype=np.uint8)  # values on overflow pages
    with LmdbWriter(path, estimated_bytes=8 << 20) as writer:
        for i, image in enumerate(images):
            writer.put_image(i, image if i % 3 else image[:8, :8], i % 10)  # and in the leaf pages
    return (path / "data.mdb").read_bytes()


@BOUNDED
@given(st.data())
def test_a_damaged_data_mdb_is_indexed_inside_the_file_or_refused(data_mdb, tmp_path, data):
    raw = bytearray(data_mdb)
    page = data.draw(st.integers(0, len(raw) // 4096 - 1)) * 4096  # damage one page: a meta, tree or value page
    for _ in range(data.draw(st.integers(1, 3))):
        raw[page + data.draw(st.integers(0, 4095))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(0, len(raw))):]
    path = tmp_path / f"data-{os.getpid()}.mdb"
    path.write_bytes(bytes(raw))
    try:
        index = value_index(path)
    except LayoutError:
        return
    finally:
        Path(path).unlink()
    assert len(index.keys) == len(index.offsets) == len(index.lengths)
    if len(index.keys):
        assert index.offsets.min() >= 0 and int((index.offsets + index.lengths).max()) <= len(raw)
        assert index.keys == sorted(set(index.keys))


@BOUNDED
@given(st.lists(st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True)),
                max_size=20))
def test_labels_are_whole_numbers_in_range_or_one_sentence(values):
    labels = np.asarray(values) if values else np.zeros(0, np.int64)
    try:
        checked = check_labels(labels, "f.h5", num_classes=10)
    except FirescaleError as exc:
        assert str(exc).startswith("f.h5 record ") and "\n" not in str(exc)
        return
    assert checked.dtype == np.int64 and ((checked >= 0) & (checked < 10)).all()
