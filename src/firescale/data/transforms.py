"""Caffe's data transformations: crop, mirror, mean subtraction and scale, reproducible per sample.

As in Caffe's DataTransformer the value of a pixel is `(x - mean) * scale`, computed after cropping
(a mean image is cropped at the same offset) and mirroring.  Random crop offsets and mirror flips for
training are a hash of (seed, stream position of the sample), so they do not depend on the number of
ranks or on which rank reads the sample, and a resumed run draws the same ones.
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from firescale.errors import FirescaleError
from firescale.userfile import read_user_bytes


@dataclass
class Transform:
    """What to do to each image: scale, mean (per-channel values or a .npy/.binaryproto file), crop, mirror."""

    scale: float = 1 / 255
    mean: tuple[float, ...] | str | None = None
    crop: int | None = None
    mirror: bool = False


def _mean_file(path: Path) -> np.ndarray:
    """A mean image from a NumPy array (.npy) or Caffe's BlobProto (.binaryproto), as float32."""
    if path.suffix not in (".npy", ".binaryproto"):
        raise FirescaleError(f"mean file {path} must end in .npy or .binaryproto")
    data = read_user_bytes(path, "mean file")
    if path.suffix == ".binaryproto":
        from firescale.caffe.datum import DatumError, parse_blobproto_mean
        try:
            return parse_blobproto_mean(data)
        except DatumError as exc:
            raise FirescaleError(f"mean file {path} is not a Caffe mean image (a BlobProto): {exc}") from None
    return _npy_mean(data, path)


def _npy_mean(data: bytes, path: Path) -> np.ndarray:
    """A .npy file's array as float32, its header read first: a header that cannot be parsed, a size that the
    file's bytes do not hold, or values that are not numbers are one sentence, never an allocation of the size
    a damaged header claims."""
    stream = io.BytesIO(data)
    try:
        with warnings.catch_warnings():   # a damaged header's escapes: Python warns as it parses them
            warnings.simplefilter("ignore")
            version = np.lib.format.read_magic(stream)
            # versions 1.0 and 2.0 differ in the header's length field; 3.0 (UTF-8 field names) never holds a mean
            readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in readers:
                raise ValueError(f"format version {version[0]}.{version[1]}, where a mean image is 1.0 or 2.0")
            shape, fortran, dtype = readers[version](stream)
    except Exception as exc:  # noqa: BLE001 - numpy parses the header with ast and tokenize: any of their errors
        raise FirescaleError(f"mean file {path} is not a NumPy array file (.npy): "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise FirescaleError(f"mean file {path} holds {dtype} values; a mean image holds numbers")
    count = int(np.prod(shape, dtype=object))
    offset = stream.tell()
    if count * dtype.itemsize != len(data) - offset:
        raise FirescaleError(f"mean file {path} holds {len(data) - offset} bytes of values, but its header says "
                             f"{shape} of {dtype} ({count * dtype.itemsize} bytes): the file is cut short or damaged")
    array = np.frombuffer(data, dtype, count, offset)
    return (array.reshape(shape[::-1]).T if fortran else array.reshape(shape)).astype(np.float32)


def load_mean(mean: tuple[float, ...] | list[float] | str | Path | None,
              shape: tuple[int, int, int]) -> np.ndarray | None:
    """The mean as a float32 array broadcastable to (H, W, C): per-channel values or a full image."""
    if mean is None:
        return None
    h, w, c = shape
    if isinstance(mean, (str, Path)):
        array = _mean_file(Path(mean))
        if array.ndim == 1:
            array = array.reshape(1, 1, -1)
        if array.ndim == 2:
            array = array[:, :, None]
        if array.shape not in ((h, w, c), (1, 1, c)):
            raise FirescaleError(f"mean file {mean} has shape {array.shape}; the dataset's images are {shape}")
        return array
    values = np.asarray(mean, np.float32).reshape(-1)
    if len(values) == 1:
        values = np.repeat(values, c)
    if len(values) != c:
        raise FirescaleError(f"mean has {len(values)} values but the images have {c} channels")
    return values.reshape(1, 1, c)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of each element."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def sample_random(seed: int, positions: np.ndarray, stream: int) -> np.ndarray:
    """Uniform uint64 draws, one per stream position, for draw kind `stream` (0 crop y, 1 crop x, 2 mirror)."""
    with np.errstate(over="ignore"):
        key = _mix(np.asarray([(seed * 0x9E3779B97F4A7C15 + stream * 0xD1B54A32D192ED03) % 2**64], np.uint64))
        return _mix(positions.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + key)


class BatchTransformer:
    """Apply a Transform to uint8 (or float) NHWC batches from a dataset of one image shape."""

    def __init__(self, transform: Transform, shape: tuple[int, int, int]) -> None:
        self.transform = transform
        self.shape = tuple(shape)
        h, w, c = self.shape
        crop = transform.crop
        if crop is not None and not 0 < crop <= min(h, w):
            raise FirescaleError(f"crop {crop} must be between 1 and the image size {min(h, w)}")
        self.mean = load_mean(transform.mean, (h, w, c))
        self.out_shape = (crop, crop, c) if crop else (h, w, c)

    def __call__(self, images: np.ndarray, *, train: bool, seed: int = 0,
                 positions: np.ndarray | None = None) -> np.ndarray:
        """Float32 (N, h, w, C): random crop and mirror when `train` (drawn per position), else centre crop."""
        n, h, w, c = images.shape
        t = self.transform
        crop = t.crop
        mean = self.mean
        if crop and (crop != h or crop != w):
            if train:
                if positions is None:
                    raise ValueError("training transforms need the stream positions of the samples")
                ys = (sample_random(seed, positions, 0) % np.uint64(h - crop + 1)).astype(np.int64)
                xs = (sample_random(seed, positions, 1) % np.uint64(w - crop + 1)).astype(np.int64)
            else:
                ys = np.full(n, (h - crop) // 2)
                xs = np.full(n, (w - crop) // 2)
            rows = ys[:, None] + np.arange(crop)
            cols = xs[:, None] + np.arange(crop)
            images = images[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]  # crop before converting
            if mean is not None and mean.shape[0] != 1:
                mean = mean[rows[:, :, None], cols[:, None, :]]
        # numpy's plain cast and in-place arithmetic are vectorised; a ufunc that casts as it computes
        # (np.multiply(..., dtype=float32) on uint8) runs buffered and is several times slower.
        x = images.astype(np.float32)
        if mean is not None:
            x -= mean
        if t.scale != 1:
            x *= np.float32(t.scale)
        if train and t.mirror:  # after the mean (Caffe subtracts it at the source pixel); scale commutes with it
            if positions is None:
                raise ValueError("training transforms need the stream positions of the samples")
            flip = (sample_random(seed, positions, 2) & np.uint64(1)).astype(bool)
            x[flip] = x[flip, :, ::-1]
        return x
