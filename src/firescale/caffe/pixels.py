"""Caffe's planar (C, H, W) pixels, BGR for colour, into (H, W, C) RGB: the compiled kernel, or numpy.

The compiled kernel (`firescale._pixels`, built by `pip install` from src/firescale/_pixels.c) walks one
row at a time and releases the GIL; numpy's fallback is several times slower (about 45 µs against 10 µs
for a 224x224x3 record).  Which one runs is decided once, at import, and is never hidden:
`PIXELS_KERNEL` is "c" or "numpy", `firescale bench io` records it, and a missing build warns.  The
environment variable FIRESCALE_PIXELS_KERNEL=numpy selects the fallback on purpose (to measure it);
=c makes a missing build an error.
"""
from __future__ import annotations

import os
import warnings
from types import ModuleType

import numpy as np

from firescale.errors import FirescaleError

KERNEL_ENV = "FIRESCALE_PIXELS_KERNEL"
KERNEL_VERSION = 3  # the version of src/firescale/_pixels.c this module calls


def _load_kernel() -> tuple[str, ModuleType | None]:
    choice = os.environ.get(KERNEL_ENV, "")
    if choice not in ("", "c", "numpy"):
        raise FirescaleError(f"environment variable {KERNEL_ENV}={choice!r}: allowed are 'c', 'numpy' or unset")
    if choice == "numpy":
        return "numpy", None
    try:
        from firescale import _pixels
    except ImportError as exc:
        problem = f"the compiled module firescale._pixels cannot be imported ({exc})"
    else:
        built = getattr(_pixels, "KERNEL_VERSION", 0)
        if built == KERNEL_VERSION:
            return "c", _pixels
        problem = (f"the compiled module {_pixels.__file__} is version {built} but this firescale calls "
                   f"version {KERNEL_VERSION} (a build left from older sources)")
    fix = "reinstall firescale with a C compiler and the Python headers (pip install -e .)"
    if choice == "c":
        raise FirescaleError(f"{KERNEL_ENV}=c but {problem}; {fix}")
    warnings.warn(f"{problem}, so the readers interleave pixels with numpy, several times slower; {fix}",
                  RuntimeWarning, stacklevel=2)
    return "numpy", None


PIXELS_KERNEL, _kernel = _load_kernel()


def compiled_kernel() -> ModuleType:
    """The compiled module; an error naming the fix when it is not in use."""
    if _kernel is None:
        raise FirescaleError(f"the compiled pixel kernel firescale._pixels is not in use ({KERNEL_ENV}="
                             f"{os.environ.get(KERNEL_ENV, '')!r}); build it with pip install -e .")
    return _kernel


def _check_shapes(planar: np.ndarray, out: np.ndarray, batch: bool) -> None:
    want = 4 if batch else 3
    if planar.ndim != want or out.ndim != want:
        form = "(N, C, H, W) into (N, H, W, C)" if batch else "(C, H, W) into (H, W, C)"
        raise ValueError(f"expected {form}, got planar {planar.shape} and out {out.shape}")
    c, h, w = planar.shape[-3:]
    if out.shape != (*planar.shape[:-3], h, w, c):
        raise ValueError(f"out has shape {out.shape}; planar {planar.shape} interleaves into "
                         f"{(*planar.shape[:-3], h, w, c)}")
    if out.dtype != planar.dtype:
        raise ValueError(f"out is {out.dtype} but planar is {planar.dtype}; the interleave does not convert")


def planar_to_hwc(planar: np.ndarray, out: np.ndarray, *, bgr: bool = True, kernel: str = PIXELS_KERNEL) -> None:
    """Caffe's (N, C, H, W) planes, BGR for colour, into `out` (N, H, W, C) RGB.

    With bgr=False three planes keep their stored order (Caffe's HDF5Data layout).  `out` must be
    writable and C-contiguous for the compiled kernel (a ValueError says so otherwise).
    """
    _check_shapes(planar, out, batch=True)
    if kernel == "c":
        c, h, w = planar.shape[1:]
        compiled_kernel().interleave(np.ascontiguousarray(planar), out, c, h, w, reverse=bgr and c == 3)
    else:
        numpy_planar_to_hwc(planar, out, bgr=bgr)


def planes_to_hwc(planes: np.ndarray, out: np.ndarray, *, kernel: str = PIXELS_KERNEL) -> None:
    """One record's (C, H, W) planes, BGR for colour, into `out` (H, W, C) RGB."""
    _check_shapes(planes, out, batch=False)
    if kernel == "c":
        c, h, w = planes.shape
        compiled_kernel().interleave(np.ascontiguousarray(planes), out, c, h, w, reverse=c == 3)
    else:
        numpy_planes_to_hwc(planes, out)


def record_to_hwc(buf, offset: int, out: np.ndarray, *, kernel: str = PIXELS_KERNEL) -> None:
    """The uint8 planes stored in `buf` (bytes or a memoryview, e.g. LMDB's map) from byte `offset`,
    into `out` (H, W, C) RGB, without copying the planes out of `buf` first."""
    h, w, c = out.shape
    if kernel == "c":
        compiled_kernel().interleave(buf, out, c, h, w, offset=offset, reverse=c == 3)
    else:
        if offset < 0 or len(buf) - offset < out.size:
            raise ValueError(f"buffer holds {len(buf)} bytes; a {h}x{w}x{c} record from offset {offset} "
                             f"needs {offset + out.size}")
        numpy_planes_to_hwc(np.frombuffer(buf, np.uint8, out.size, offset).reshape(c, h, w), out)


def numpy_planar_to_hwc(planar: np.ndarray, out: np.ndarray, *, bgr: bool = True) -> None:
    """The fallback for (N, C, H, W): one channel at a time, so numpy's inner loop runs along a row
    (about ten times faster than assigning the transposed view in one go)."""
    c = planar.shape[1]
    reverse = bgr and c == 3
    for k in range(c):
        out[..., k] = planar[:, c - 1 - k] if reverse else planar[:, k]


def numpy_planes_to_hwc(planes: np.ndarray, out: np.ndarray) -> None:
    """The fallback for one (C, H, W) record, a channel at a time (a 150 KB record stays in L2)."""
    c = planes.shape[0]
    for k in range(c):
        out[..., k] = planes[c - 1 - k] if c == 3 else planes[k]
