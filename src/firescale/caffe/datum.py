"""Caffe's Datum record (caffe.proto), encoded and decoded byte-for-byte as Caffe does it.

    message Datum { optional int32 channels = 1; optional int32 height = 2; optional int32 width = 3;
                    optional bytes data = 4; optional int32 label = 5;
                    repeated float float_data = 6; optional bool encoded = 7 [default = false]; }

Pixels in a Datum are planar (C, H, W) and, for three channels, in OpenCV's BGR order, which is what
Caffe's `convert_imageset` writes.  Everything outside this module sees images as (H, W, C) in RGB:
`datum_to_image` and `image_to_datum` do the two conversions.  An encoded Datum holds a whole JPEG or
PNG file (decoded here with Pillow straight to RGB); a float Datum carries `float_data` instead of
`data` and decodes to float32.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# PIXELS_KERNEL ("c" or "numpy"), planar_to_hwc and planes_to_hwc are re-exported here for the readers.
from firescale.caffe.pixels import (
    PIXELS_KERNEL,
    compiled_kernel,
    numpy_planar_to_hwc,
    numpy_planes_to_hwc,
    planes_to_hwc,
    record_to_hwc,
)
from firescale.caffe.wire import (
    FIXED32,
    LENGTH_DELIMITED,
    VARINT,
    WireError,
    as_int32,
    decode_varint,
    encode_varint,
    iter_fields,
    tag,
)

KEY_FORMAT = "%08d"


class DatumError(ValueError):
    """A Datum that cannot be decoded or whose contents contradict its header."""


@dataclass
class Datum:
    """One Caffe record; `None` marks an optional field that is not set."""

    channels: int | None = None
    height: int | None = None
    width: int | None = None
    data: bytes | None = None
    label: int | None = None
    float_data: list[float] = field(default_factory=list)
    encoded: bool | None = None


def datum_key(index: int, path: str | None = None) -> bytes:
    """The LMDB key Caffe's convert_imageset writes: "%08d" of the index, then "_path" if given."""
    key = KEY_FORMAT % index
    return (key + "_" + path if path else key).encode("utf-8")


def encode_datum(datum: Datum) -> bytes:
    """Serialize in field-number order, set fields only, as protobuf's C++ SerializeToString does."""
    out = bytearray()
    for number, value in ((1, datum.channels), (2, datum.height), (3, datum.width)):
        if value is not None:
            out += tag(number, VARINT) + encode_varint(value)
    if datum.data is not None:
        out += tag(4, LENGTH_DELIMITED) + encode_varint(len(datum.data)) + datum.data
    if datum.label is not None:
        out += tag(5, VARINT) + encode_varint(datum.label)
    for real in datum.float_data:  # proto2 repeated scalars are not packed unless declared so
        out += tag(6, FIXED32) + struct.pack("<f", real)
    if datum.encoded is not None:
        out += tag(7, VARINT) + encode_varint(int(datum.encoded))
    return bytes(out)


def decode_datum(buf: bytes | memoryview) -> Datum:
    """Parse a serialized Datum; unknown fields are an error since Caffe never writes them."""
    datum = Datum()
    floats: list[float] = []
    try:
        for number, wire_type, field_value in iter_fields(buf):
            value: Any = field_value    # an int for VARINT and FIXED32, the bytes for LENGTH_DELIMITED
            if number in (1, 2, 3, 5) and wire_type == VARINT:
                setattr(datum, {1: "channels", 2: "height", 3: "width", 5: "label"}[number], as_int32(value))
            elif number == 4 and wire_type == LENGTH_DELIMITED:
                datum.data = bytes(value)
            elif number == 6 and wire_type == FIXED32:
                floats.append(struct.unpack("<f", struct.pack("<I", value))[0])
            elif number == 6 and wire_type == LENGTH_DELIMITED:  # packed, as a proto3 writer would
                if len(value) % 4:
                    raise DatumError("packed float_data is not a whole number of floats")
                floats.extend(np.frombuffer(value, "<f4").tolist())
            elif number == 7 and wire_type == VARINT:
                datum.encoded = bool(value)
            else:
                raise DatumError(f"unexpected field {number} (wire type {wire_type}) in a Datum")
    except WireError as exc:
        raise DatumError(str(exc)) from exc
    datum.float_data = floats
    return datum


def image_to_datum(image: np.ndarray, label: int) -> Datum:
    """A raw Datum from an (H, W, C) uint8 RGB (or grey) image, as convert_imageset would store it."""
    if image.ndim != 3 or image.dtype != np.uint8:
        raise DatumError(f"expected an (H, W, C) uint8 image, got {image.dtype} {image.shape}")
    height, width, channels = image.shape
    planar = image[:, :, ::-1] if channels == 3 else image
    data = np.ascontiguousarray(planar.transpose(2, 0, 1)).tobytes()
    return Datum(channels=channels, height=height, width=width, data=data, label=int(label), encoded=False)


def _decode_encoded(data: bytes) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            img: Image.Image = opened
            if img.mode not in ("L", "RGB"):
                img = img.convert("RGB")
            array = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise DatumError(f"encoded image data cannot be decoded ({exc})") from exc
    return array[:, :, None] if array.ndim == 2 else array


def datum_to_image(datum: Datum) -> tuple[np.ndarray, int]:
    """(image (H, W, C) RGB, label) from a raw, float or encoded Datum; uint8 except for float Datums."""
    label = 0 if datum.label is None else datum.label
    if datum.encoded:
        if not datum.data:
            raise DatumError("an encoded Datum has no data")
        return _decode_encoded(datum.data), label
    c, h, w = datum.channels, datum.height, datum.width
    if not c or not h or not w or min(c, h, w) < 0:
        raise DatumError(f"a raw Datum needs positive channels, height and width, got {c}, {h}, {w}")
    count = c * h * w
    planar: np.ndarray
    if datum.data:
        if len(datum.data) != count:
            raise DatumError(f"data holds {len(datum.data)} bytes but channels*height*width is {count}")
        planar = np.frombuffer(datum.data, np.uint8).reshape(c, h, w)
    elif datum.float_data:
        if len(datum.float_data) != count:
            raise DatumError(f"float_data holds {len(datum.float_data)} values, expected {count}")
        planar = np.asarray(datum.float_data, np.float32).reshape(c, h, w)
    else:
        raise DatumError("a raw Datum has neither data nor float_data")
    image = np.empty((h, w, c), planar.dtype)
    planes_to_hwc(planar, image)
    return image, label


class RawDatumCodec:
    """Fast decoding of the raw uint8 Datums one (H, W, C) shape produces; anything else falls back.

    Every raw Datum of a given shape starts with the same header bytes and stores its pixels right
    after it, so decoding is a prefix check, a copy of the pixel bytes and a parse of the label at the
    tail.  With the compiled kernel (kernel="c") one call does that for the whole batch, from the
    record buffers (LMDB's memory map) straight into the caller's batch, with the GIL released.  With
    numpy, records of `direct_bytes` or more are interleaved one by one from their buffers; smaller
    ones are joined and checked as one array, since for a few dozen bytes per record the Python work
    per record would cost more than the bytes.
    """

    DIRECT_BYTES = 4096

    def __init__(self, shape: tuple[int, int, int], *, direct_bytes: int = DIRECT_BYTES,
                 kernel: str = PIXELS_KERNEL) -> None:
        if kernel not in ("c", "numpy"):
            raise ValueError(f"kernel must be 'c' or 'numpy', got {kernel!r}")
        self.kernel = kernel
        self.shape = tuple(int(s) for s in shape)
        h, w, c = self.shape
        self.size = h * w * c
        self.header = (tag(1, VARINT) + encode_varint(c) + tag(2, VARINT) + encode_varint(h)
                       + tag(3, VARINT) + encode_varint(w) + tag(4, LENGTH_DELIMITED) + encode_varint(self.size))
        self.direct = self.size >= direct_bytes

    def decode_batch(self, values: list, images: np.ndarray, labels: np.ndarray) -> list[int]:
        """Decode the records laid out as Caffe writes them into `images[j]` and `labels[j]`.

        Returns the positions j it did not decode (other layouts; with numpy, for small records also
        labels of 128 or more and a missing encoded field), for `decode_into` one by one.
        """
        if self.kernel == "c":
            h, w, c = self.shape
            return compiled_kernel().decode_raw_datums(values, self.header, images, labels, c, h, w, reverse=c == 3)
        if self.direct:
            return self._decode_each(values, images, labels)
        return self._decode_joined(values, images, labels)

    def _decode_each(self, values: list, images: np.ndarray, labels: np.ndarray) -> list[int]:
        h, w, c = self.shape
        start = len(self.header)
        end = start + self.size
        header = self.header
        rest = []
        for j, value in enumerate(values):
            # the tail after the pixels: 0x28 label-varint, then nothing or 0x38 0x00 (encoded=false)
            if len(value) < end + 2 or value[:start] != header or value[end] != 0x28:
                rest.append(j)
                continue
            if len(value) == end + 4 and value[end + 1] < 0x80 and value[end + 2] == 0x38 and value[end + 3] == 0:
                label = value[end + 1]
            else:
                tail = bytes(value[end:])
                try:
                    label, pos = _tail_label(tail)
                except WireError:
                    rest.append(j)
                    continue
                if tail[pos:] not in (b"", b"\x38\x00"):
                    rest.append(j)
                    continue
            numpy_planes_to_hwc(np.frombuffer(value, np.uint8, self.size, start).reshape(c, h, w), images[j])
            labels[j] = label
        return rest

    def _decode_joined(self, values: list, images: np.ndarray, labels: np.ndarray) -> list[int]:
        start = len(self.header)
        end = start + self.size
        full = end + 4  # ... 0x28 label 0x38 0x00
        lengths = np.fromiter((len(v) for v in values), np.int64, len(values))
        rows = np.nonzero(lengths == full)[0]
        if len(rows) == 0:
            return list(range(len(values)))
        block = np.frombuffer(b"".join([values[j] for j in rows.tolist()]), np.uint8).reshape(len(rows), full)
        header = np.frombuffer(self.header, np.uint8)
        ok = ((block[:, :start] == header).all(axis=1) & (block[:, end] == 0x28) & (block[:, end + 1] < 0x80)
              & (block[:, end + 2] == 0x38) & (block[:, end + 3] == 0x00))
        good = rows[ok]
        h, w, c = self.shape
        every = len(good) == len(values)
        planar = (block if ok.all() else block[ok])[:, start:end].reshape(-1, c, h, w)
        target = images if every else np.empty((len(good), h, w, c), images.dtype)
        numpy_planar_to_hwc(planar, target)
        if not every:
            images[good] = target
        labels[good] = block[ok, end + 1]
        rest = np.ones(len(values), bool)
        rest[good] = False
        return np.nonzero(rest)[0].tolist()

    def decode_into(self, value: bytes, out: np.ndarray) -> int:
        """Write the image into `out` (H, W, C) and return the label; raise DatumError if malformed."""
        start = len(self.header)
        end = start + self.size
        tail = value[end:]
        if value[:start] == self.header and len(tail) >= 2 and tail[0] == 0x28:
            try:
                label, pos = _tail_label(tail)
            except WireError:  # a label varint cut short or out of int32's range: the full decoder says which
                pos = -1
            if pos >= 0 and tail[pos:] in (b"", b"\x38\x00"):
                record_to_hwc(value, start, out, kernel=self.kernel)
                return label
        image, label = datum_to_image(decode_datum(value))
        if image.shape != self.shape:
            raise DatumError(f"record has shape {image.shape}, the dataset's is {self.shape}")
        out[...] = image
        return label


def _tail_label(tail: bytes) -> tuple[int, int]:
    value, pos = decode_varint(tail, 1)
    return as_int32(value), pos


def parse_blobproto_mean(buf: bytes) -> np.ndarray:
    """A mean image (H, W, C) RGB float32 from a Caffe BlobProto (compute_image_mean's .binaryproto)."""
    dims: dict[str, int] = {}
    shape: list[int] = []
    values: list[float] = []
    try:
        for number, wire_type, field_value in iter_fields(buf):
            value: Any = field_value    # an int for VARINT and FIXED32, the bytes for LENGTH_DELIMITED
            if number in (1, 2, 3, 4) and wire_type == VARINT:
                dims[{1: "num", 2: "channels", 3: "height", 4: "width"}[number]] = int(value)
            elif number == 5 and wire_type == LENGTH_DELIMITED:
                if len(value) % 4:
                    raise DatumError(f"packed data holds {len(value)} bytes, not a whole number of floats")
                values.extend(np.frombuffer(value, "<f4").tolist())
            elif number == 5 and wire_type == FIXED32:
                values.append(struct.unpack("<f", struct.pack("<I", value))[0])
            elif number == 7 and wire_type == LENGTH_DELIMITED:
                for sub, sub_type, sub_value in iter_fields(value):
                    dim: Any = sub_value
                    if sub == 1 and sub_type == VARINT:
                        shape.append(int(dim))
                    elif sub == 1 and sub_type == LENGTH_DELIMITED:
                        pos = 0
                        while pos < len(dim):
                            d, pos = decode_varint(dim, pos)
                            shape.append(int(d))
    except WireError as exc:
        raise DatumError(f"not a BlobProto ({exc})") from exc
    if shape:
        chw = shape[-3:] if len(shape) >= 3 else [1] * (3 - len(shape)) + shape
    else:
        chw = [dims.get("channels", 1), dims.get("height", 1), dims.get("width", 1)]
    c, h, w = chw
    if len(values) != c * h * w:
        raise DatumError(f"BlobProto holds {len(values)} values for shape {c}x{h}x{w}")
    image = np.asarray(values, np.float32).reshape(c, h, w).transpose(1, 2, 0)
    return np.ascontiguousarray(image[:, :, ::-1] if c == 3 else image)
