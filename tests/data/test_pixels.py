"""The compiled pixel kernel is built, gives exactly numpy's arrays, rejects what does not fit, and lets
other threads run while it works."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from firescale.caffe import pixels
from firescale.caffe.datum import PIXELS_KERNEL, RawDatumCodec, encode_datum, image_to_datum
from firescale.caffe.pixels import numpy_planar_to_hwc, numpy_planes_to_hwc, planar_to_hwc, planes_to_hwc, record_to_hwc


def test_the_extension_is_built_and_in_use():
    from firescale import _pixels as kernel  # an ImportError here means pip install did not build it

    assert callable(kernel.interleave) and callable(kernel.decode_raw_datums)
    assert kernel.KERNEL_VERSION == pixels.KERNEL_VERSION, "firescale._pixels is stale: reinstall (pip install -e .)"
    if os.environ.get(pixels.KERNEL_ENV) != "numpy":
        assert PIXELS_KERNEL == "c"


SHAPES = [(5, 1, 7, 9), (4, 3, 17, 33), (3, 4, 5, 31), (2, 3, 1, 1), (2, 5, 3, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.uint16, np.float64])
def test_compiled_and_numpy_interleave_agree(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    planar = (rng.integers(0, 256, shape) if dtype in (np.uint8, np.uint16)
              else rng.standard_normal(shape)).astype(dtype)
    n, c, h, w = shape
    expected = planar.transpose(0, 2, 3, 1)[..., ::-1] if c == 3 else planar.transpose(0, 2, 3, 1)
    for bgr in (True, False):
        want = expected if bgr or c != 3 else planar.transpose(0, 2, 3, 1)
        got_c, got_np = np.full((n, h, w, c), 7, dtype), np.full((n, h, w, c), 9, dtype)
        planar_to_hwc(planar, got_c, bgr=bgr, kernel="c")
        numpy_planar_to_hwc(planar, got_np, bgr=bgr)
        assert np.array_equal(got_c, want) and np.array_equal(got_np, want)
    for i in range(n):  # one record's planes
        one_c, one_np = np.empty((h, w, c), dtype), np.empty((h, w, c), dtype)
        planes_to_hwc(planar[i], one_c, kernel="c")
        numpy_planes_to_hwc(planar[i], one_np)
        assert np.array_equal(one_c, one_np) and np.array_equal(one_c, expected[i])


@pytest.mark.parametrize("c", [1, 3, 4])
def test_one_record_straight_from_a_buffer_at_an_offset(c):
    rng = np.random.default_rng(c)
    h, w = 37, 51  # 51 = three 16-pixel blocks and a tail of 3
    planes = rng.integers(0, 256, (c, h, w), dtype=np.uint8)
    buf = b"header!" + planes.tobytes() + b"\x28\x05"
    got = {}
    for kernel in ("c", "numpy"):
        got[kernel] = np.empty((h, w, c), np.uint8)
        record_to_hwc(memoryview(buf), 7, got[kernel], kernel=kernel)
    want = planes.transpose(1, 2, 0)[..., ::-1] if c == 3 else planes.transpose(1, 2, 0)
    assert np.array_equal(got["c"], want) and np.array_equal(got["numpy"], want)


def test_wide_rows_cover_the_vector_loop_and_its_tail():
    from firescale import _pixels

    rng = np.random.default_rng(11)
    for w in (15, 16, 17, 47, 48, 224, 1000):
        planar = rng.integers(0, 256, (2, 3, 3, w), dtype=np.uint8)
        out = np.empty((2, 3, w, 3), np.uint8)
        _pixels.interleave(planar, out, 3, 3, w, reverse=False)
        assert np.array_equal(out, planar.transpose(0, 2, 3, 1))


def test_sizes_that_do_not_fit_are_value_errors():
    from firescale import _pixels

    planar = np.zeros((2, 3, 4, 5), np.uint8)
    out = np.empty((2, 4, 5, 3), np.uint8)
    cases = [
        ((planar, out[:1].reshape(-1)[:-1], 3, 4, 5), "not a whole number of 4x5x3 records"),
        ((planar[:1], out, 3, 4, 5), r"src holds 60 bytes; 2 records of 60 bytes from offset 0 need 120"),
        ((planar.tobytes(), out, 3, 4, 5, 1), "from offset 1 need 121"),
        ((planar.tobytes(), out, 3, 4, 5, -1), "offset -1"),
        ((planar, out.transpose(0, 2, 1, 3), 3, 4, 5), "dst must be a writable C-contiguous buffer"),
        ((planar, bytes(120), 3, 4, 5), "dst must be a writable C-contiguous buffer"),
        ((planar[:, :, :, ::2], out, 3, 4, 5), "src must be a C-contiguous bytes-like object"),
        ((planar, out, 0, 4, 5), "channels, height and width must be positive"),
        ((planar.astype(np.float32), out.astype(np.int32), 3, 4, 5), "src must be raw bytes or of dst's format"),
        ((planar, np.zeros((2, 4, 5, 3), "V3"), 3, 4, 5), "3-byte elements; 1, 2, 4 or 8 bytes are supported"),
        ((out, out, 3, 4, 5), "src and dst overlap"),
        ((out.reshape(-1)[:60], out.reshape(-1)[60:], 3, 4, 5), None),  # adjacent halves are fine
    ]
    for args, message in cases:
        if message is None:
            _pixels.interleave(*args)
            continue
        with pytest.raises(ValueError, match=message):
            _pixels.interleave(*args)
    with pytest.raises(ValueError, match=r"out has shape \(2, 5, 4, 3\)"):
        planar_to_hwc(planar, np.empty((2, 5, 4, 3), np.uint8), kernel="c")
    with pytest.raises(ValueError, match="out is float32 but planar is uint8"):
        planar_to_hwc(planar, np.empty((2, 4, 5, 3), np.float32), kernel="numpy")
    with pytest.raises(ValueError, match=r"a 4x5x3 record from offset 3 needs 63"):
        record_to_hwc(bytes(61), 3, np.empty((4, 5, 3), np.uint8), kernel="numpy")


def test_batch_decode_parses_labels_as_the_wire_format_does():
    from firescale import _pixels

    rng = np.random.default_rng(2)
    shape = (5, 7, 3)
    images = rng.integers(0, 256, (8, *shape), dtype=np.uint8)
    labels = [0, 127, 128, 300, -1, -(1 << 31), (1 << 31) - 1, 70000]
    values = [encode_datum(image_to_datum(x, y)) for x, y in zip(images, labels)]
    codec = RawDatumCodec(shape, kernel="c")
    bad = [values[0][:-3],                          # cut inside the tail
           values[1] + b"\x00",                     # a byte after encoded=false
           values[2][:-4] + b"\x28" + b"\xff" * 10 + b"\x01",  # varint of 11 bytes
           values[3][:-4] + b"\x28\x80\x80\x80\x80\x08",  # 2**31: no int32
           b"\x09" + values[4][1:],                  # another header
           values[5][:-2] + b"\x38\x01"]            # encoded=true
    out, out_labels = np.zeros((14, *shape), np.uint8), np.full(14, -7, np.int64)
    todo = _pixels.decode_raw_datums(values + bad, codec.header, out, out_labels, 3, 5, 7, reverse=True)
    assert todo == list(range(8, 14))
    assert np.array_equal(out[:8], images) and out_labels[:8].tolist() == labels
    assert not out[8:].any() and (out_labels[8:] == -7).all()  # rows left for the full decoder stay untouched
    with pytest.raises(ValueError, match="labels must be int64 with 2 elements"):
        _pixels.decode_raw_datums(values[:2], codec.header, out[:2], np.empty(2, np.int32), 3, 5, 7)
    with pytest.raises(ValueError, match=r"dst must be uint8 holding 3 records of 5x7x3"):
        _pixels.decode_raw_datums(values[:3], codec.header, out[:2], out_labels[:3], 3, 5, 7)
    with pytest.raises(ValueError, match=r"values\[1\] is not a contiguous bytes-like object"):
        _pixels.decode_raw_datums([values[0], 17], codec.header, out[:2], out_labels[:2], 3, 5, 7)


@pytest.mark.parametrize("shape", [(224, 224, 3), (227, 227, 3)], ids=["rows-aligned", "rows-unaligned"])
def test_batches_past_the_streaming_size_decode_exactly(shape):
    """A batch of 16 MiB or more is written with streaming stores (rows on a 16-byte boundary; 227
    pixels x 3 puts most rows off it, which the kernel writes normally): the bytes are the same."""
    from firescale import _pixels

    n = 16 * 2**20 // (shape[0] * shape[1] * 3) + 2
    rng = np.random.default_rng(n)
    images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    values = [encode_datum(image_to_datum(x, int(y))) for x, y in zip(images, range(n))]
    codec = RawDatumCodec(shape, kernel="c")
    out, labels = np.zeros((n, *shape), np.uint8), np.zeros(n, np.int64)
    assert _pixels.decode_raw_datums(values, codec.header, out, labels, 3, shape[0], shape[1], reverse=True) == []
    assert np.array_equal(out, images) and labels.tolist() == list(range(n))
    joined = b"".join(values)                     # the same records in one buffer, as a map of data.mdb
    lengths = np.array([len(v) for v in values], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    order = rng.permutation(n)
    out[:], labels[:] = 0, -1
    assert _pixels.decode_raw_datums_at(joined, offsets[order], lengths[order], codec.header, out, labels,
                                        3, shape[0], shape[1], reverse=True) == []
    assert np.array_equal(out, images[order]) and labels.tolist() == order.tolist()


def test_the_gil_is_free_while_a_large_interleave_runs():
    """With a long switch interval, the main thread runs during the call only if the kernel released the GIL."""
    from firescale import _pixels

    planar = np.zeros((1, 7, 1_500_000, 1), np.uint8)  # 7 channels, 1-pixel rows: the slowest loop, ~10 ms+
    out = np.empty((1, 1_500_000, 1, 7), np.uint8)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        for _ in range(3):
            window: list[float] = []
            ticks: list[float] = []

            def work(window: list[float] = window) -> None:
                t0 = time.perf_counter()
                for _ in range(5):
                    _pixels.interleave(planar, out, 7, 1_500_000, 1)
                window.extend((t0, time.perf_counter()))

            worker = threading.Thread(target=work)
            worker.start()
            while worker.is_alive():
                time.sleep(0.0005)
                ticks.append(time.perf_counter())
            worker.join()
            inside = [t for t in ticks if window[0] < t < window[1]]
            if len(inside) >= 3:
                break
        assert len(inside) >= 3, f"the main thread ran {len(inside)} times during {window[1] - window[0]:.3f} s"
    finally:
        sys.setswitchinterval(previous)


def _kernel_in_a_fresh_interpreter(env_value: str | None, block_import: bool = False) -> subprocess.CompletedProcess:
    code = ("import sys, warnings\n"
            + ("sys.modules['firescale._pixels'] = None\n" if block_import else "")
            + "warnings.simplefilter('always')\n"
            "from firescale.caffe.datum import PIXELS_KERNEL\n"
            "print(PIXELS_KERNEL)\n")
    env = {k: v for k, v in os.environ.items() if k != pixels.KERNEL_ENV}
    if env_value is not None:
        env[pixels.KERNEL_ENV] = env_value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_the_fallback_is_chosen_on_purpose_or_announced():
    forced = _kernel_in_a_fresh_interpreter("numpy")
    assert forced.returncode == 0 and forced.stdout.strip() == "numpy" and "RuntimeWarning" not in forced.stderr
    missing = _kernel_in_a_fresh_interpreter(None, block_import=True)
    assert missing.returncode == 0 and missing.stdout.strip() == "numpy"
    assert "RuntimeWarning: the compiled module firescale._pixels cannot be imported" in missing.stderr
    required = _kernel_in_a_fresh_interpreter("c", block_import=True)
    assert required.returncode != 0 and "FIRESCALE_PIXELS_KERNEL=c but the compiled module" in required.stderr
    wrong = _kernel_in_a_fresh_interpreter("fast")
    assert wrong.returncode != 0 and "allowed are 'c', 'numpy' or unset" in wrong.stderr
