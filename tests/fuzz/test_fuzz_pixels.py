"""Fuzzing the compiled pixel kernel (src/firescale/_pixels.c) against NumPy: for any shape, element size,
offset and channel order its results equal NumPy's, and for arguments that do not fit it raises ValueError
(TypeError or OverflowError for an argument of another kind), never reading or writing outside a buffer.
`make fuzz` runs this against a build with AddressSanitizer, which turns an access out of bounds into a
report and an abort (docs/testing.md#the-fuzz-tier)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fuzzing import budget, trial
from hypothesis import given
from hypothesis import strategies as st

from firescale.caffe.datum import RawDatumCodec, encode_datum, image_to_datum
from firescale.caffe.pixels import compiled_kernel, planar_to_hwc, record_to_hwc

pytestmark = pytest.mark.fuzz

KERNEL = compiled_kernel()
# Widths around the SSSE3 loop's 16 pixels and its tail; small and odd heights and channel counts.
SIDES = st.one_of(st.sampled_from([1, 2, 3, 15, 16, 17, 31, 32, 33, 48]), st.integers(1, 70))
CHANNELS = st.one_of(st.sampled_from([1, 3]), st.integers(1, 6))
DTYPES = st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64])
BAD = (ValueError, TypeError, OverflowError)


def reference(src: bytes, offset: int, n: int, c: int, h: int, w: int, dtype, reverse: bool) -> np.ndarray:
    planes = np.frombuffer(src, dtype, n * c * h * w, offset).reshape(n, c, h, w)
    return (planes[:, ::-1] if reverse else planes).transpose(0, 2, 3, 1)


@budget(200)
@given(st.integers(0, 4), CHANNELS, SIDES, SIDES, DTYPES, st.integers(0, 9), st.booleans(), st.binary(max_size=4))
def test_interleave_equals_numpy_at_any_shape_offset_and_order(n, c, h, w, dtype, offset, reverse, tail):
    itemsize = np.dtype(dtype).itemsize
    rng = np.random.default_rng(n * 1000 + c * 100 + h + w)
    src = bytes(offset) + rng.integers(0, 256, n * c * h * w * itemsize, dtype=np.uint8).tobytes() + tail
    dst = np.full((n, h, w, c), 0x5A, dtype)
    with trial("pixels interleave"):
        KERNEL.interleave(src, dst, c, h, w, offset=offset, reverse=reverse)
    want = reference(src, offset, n, c, h, w, dtype, reverse)
    assert dst.tobytes() == np.ascontiguousarray(want).tobytes()


@budget(200)
@given(st.integers(-3, 5), st.integers(-2, 40), st.integers(-2, 40), st.integers(0, 3), st.integers(-20, 4000),
       st.integers(0, 3000), st.sampled_from([np.uint8, np.uint16, np.float32, np.int8, np.complex128]),
       st.sampled_from(["bytes", "array", "strided", "readonly", "list"]))
def test_interleave_with_sizes_that_do_not_fit_raises_and_touches_nothing_outside(c, h, w, n, offset, src_len,
                                                                                  dtype, dst_kind):
    """Any channels, height, width, offset and buffer sizes: the records are interleaved as NumPy would, or a
    ValueError (TypeError for a destination that is not a writable array) says why not."""
    src = np.random.default_rng(src_len).integers(0, 256, src_len, dtype=np.uint8).tobytes()
    dst_shape = (n, max(h, 1), max(w, 1), max(c, 1))
    base = np.full(dst_shape, 3, dtype)
    dst = {"bytes": bytes(base.tobytes()), "array": base, "strided": base[:, ::-1] if base.shape[1] > 1 else base.T,
           "readonly": base.copy(), "list": base.tolist()}[dst_kind]
    if dst_kind == "readonly":
        dst.setflags(write=False)
    with trial("pixels bad sizes"):
        try:
            KERNEL.interleave(src, dst, c, h, w, offset=offset)
        except BAD:
            return
    assert isinstance(dst, np.ndarray) and dst.flags.writeable and dst.flags.c_contiguous
    assert dst.tobytes() == np.ascontiguousarray(reference(src, offset, *((n, c, h, w)), dst.dtype, False)).tobytes()


@budget(150)
@given(st.sampled_from([(1, 1, 1), (2, 3, 1), (7, 17, 3), (5, 16, 3), (4, 4, 4), (33, 2, 3)]),
       st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.sampled_from(["ok", "cut", "tail", "header", "noise",
                                                                           "long", "empty"]),
                          st.integers(0, 255)), max_size=6),
       st.booleans())
def test_batch_decodes_of_raw_datums_equal_the_python_decoder(shape, records, from_map):
    """decode_raw_datums (the records as bytes objects) and decode_raw_datums_at (the records inside one buffer,
    as LMDB's map holds them) decode a record exactly when its bytes are laid out as Caffe writes a raw Datum,
    into the image and label NumPy's decoder gives, and leave every other record to the caller."""
    h, w, c = shape
    codec = RawDatumCodec(shape, kernel="numpy", direct_bytes=1)
    values = []
    for label, kind, fill in records:
        image = ((np.arange(h * w * c) + fill) % 256).astype(np.uint8).reshape(shape)
        good = encode_datum(image_to_datum(image, label))
        values.append({"ok": good, "cut": good[:fill % max(1, len(good))], "tail": good + bytes([fill]),
                       "header": bytes([fill]) + good[1:], "long": good[:-2] + b"\xff" * 11 + b"\x01",
                       "noise": bytes([fill] * (fill % 40)), "empty": b""}[kind])
    want_images, want_labels = np.zeros((len(values), *shape), np.uint8), np.full(len(values), -7, np.int64)
    want_rest = codec.decode_batch(values, want_images, want_labels)
    images, labels = np.zeros_like(want_images), np.full(len(values), -7, np.int64)
    with trial("pixels decode_raw_datums"):
        if from_map:
            offsets = np.array([sum(len(u) + 3 for u in values[:j]) for j in range(len(values))], np.int64)
            buffer = b"".join(v + b"\x00\x01\x02" for v in values)
            rest = KERNEL.decode_raw_datums_at(buffer, offsets, np.array([len(v) for v in values], np.int64),
                                               codec.header, images, labels, c, h, w, reverse=c == 3)
        else:
            rest = KERNEL.decode_raw_datums(values, codec.header, images, labels, c, h, w, reverse=c == 3)
    assert rest == want_rest
    assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)


@budget(150)
@given(st.integers(0, 200), st.lists(st.tuples(st.integers(-5, 260), st.integers(-5, 60)), max_size=5),
       st.integers(1, 6))
def test_records_outside_the_map_are_refused_before_anything_is_written(size, spans, c):
    """decode_raw_datums_at and gather with offsets and lengths anywhere: inside the buffer they read as NumPy
    slices it; any record or row outside it is a ValueError, and the outputs are left as they were."""
    buffer = bytes(range(256)) * (size // 256 + 1)
    buffer = buffer[:size]
    offsets = np.array([o for o, _ in spans], np.int64)
    lengths = np.array([n for _, n in spans], np.int64)
    images, labels = np.full((len(spans), 1, 1, c), 9, np.uint8), np.full(len(spans), 9, np.int64)
    inside = all(0 <= o <= size and 0 <= n <= size - o for o, n in spans)
    with trial("pixels bounds"):
        try:
            KERNEL.decode_raw_datums_at(buffer, offsets, lengths, b"\x08", images, labels, c, 1, 1)
            assert inside
        except ValueError:
            assert not inside
            assert (images == 9).all() and (labels == 9).all()
        row = int(lengths.max()) if len(spans) and lengths.max() > 0 else 1
        rows = np.full((len(spans), row), 9, np.uint8)
        fits = all(0 <= o and o + row <= size for o, _ in spans)
        try:
            KERNEL.gather(buffer, offsets, rows)
        except ValueError:
            assert not fits and (rows == 9).all()
            return
    assert fits
    for j, (o, _) in enumerate(spans):
        assert rows[j].tobytes() == buffer[o:o + row]


@budget(60)
@given(st.integers(1, 3), st.sampled_from([(1, 1, 1), (3, 5, 3), (16, 16, 3), (9, 33, 1), (2, 2, 5)]),
       st.integers(0, 64), st.booleans())
def test_the_python_entries_agree_with_numpy(n, shape, offset, bgr):
    """The readers' entries (planar_to_hwc, record_to_hwc) with the compiled kernel and with NumPy's."""
    h, w, c = shape
    planar = np.random.default_rng(offset).integers(0, 256, (n, c, h, w), dtype=np.uint8)
    got, want = np.empty((n, h, w, c), np.uint8), np.empty((n, h, w, c), np.uint8)
    with trial("pixels entries"):
        planar_to_hwc(planar, got, bgr=bgr, kernel="c")
        planar_to_hwc(planar, want, bgr=bgr, kernel="numpy")
        assert np.array_equal(got, want)
        buf = bytes(offset) + planar[0].tobytes()
        one, ref = np.empty(shape, np.uint8), np.empty(shape, np.uint8)
        record_to_hwc(buf, offset, one, kernel="c")
        record_to_hwc(buf, offset, ref, kernel="numpy")
        assert np.array_equal(one, ref)
        with pytest.raises(ValueError):
            record_to_hwc(buf, offset + 1, one, kernel="c")


def test_make_fuzz_runs_the_build_with_address_sanitizer():
    """Under `make fuzz` the kernel in use is the AddressSanitizer build it named, with ASan's runtime loaded;
    under `make test`, the installed build."""
    import os

    import firescale._pixels as loaded

    asan = os.environ.get("FIRESCALE_FUZZ_ASAN_KERNEL")
    if not asan:
        assert "asan" not in Path(loaded.__file__).parts
        return
    assert loaded.__file__ == asan and KERNEL is loaded
    assert "libasan" in Path("/proc/self/maps").read_text()
