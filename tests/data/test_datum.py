"""Caffe Datum encoding and decoding against protobuf bytes written by hand from the wire format."""
from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from firescale.caffe.datum import (
    Datum,
    DatumError,
    RawDatumCodec,
    datum_key,
    datum_to_image,
    decode_datum,
    encode_datum,
    image_to_datum,
    parse_blobproto_mean,
)


def test_raw_grey_datum_matches_hand_built_bytes():
    pixels = bytes(range(10, 16))  # 1 channel, 2 rows, 3 columns
    # tag(1,varint)=0x08 tag(2)=0x10 tag(3)=0x18 tag(4,bytes)=0x22 tag(5)=0x28 tag(7)=0x38
    wire = b"\x08\x01\x10\x02\x18\x03\x22\x06" + pixels + b"\x28\x07\x38\x00"
    image = np.frombuffer(pixels, np.uint8).reshape(2, 3, 1)
    assert encode_datum(image_to_datum(image, 7)) == wire
    datum = decode_datum(wire)
    assert (datum.channels, datum.height, datum.width, datum.label, datum.encoded) == (1, 2, 3, 7, False)
    decoded, label = datum_to_image(datum)
    assert label == 7 and np.array_equal(decoded, image)


def test_colour_datum_is_planar_bgr_and_decodes_to_rgb():
    rgb = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3)
    planar_bgr = rgb[:, :, ::-1].transpose(2, 0, 1).tobytes()
    wire = b"\x08\x03\x10\x02\x18\x02\x22\x0c" + planar_bgr + b"\x28\x96\x01\x38\x00"  # label 150: two bytes
    assert encode_datum(image_to_datum(rgb, 150)) == wire
    image, label = datum_to_image(decode_datum(wire))
    assert label == 150 and np.array_equal(image, rgb)


def test_negative_label_takes_ten_bytes():
    wire = b"\x28" + b"\xff" * 9 + b"\x01"
    assert decode_datum(wire).label == -1
    assert encode_datum(Datum(label=-1)) == wire


def test_float_datum_unpacked_and_packed():
    values = [0.5, -1.25, 3.0, 4.5]
    # fields go out in number order: label (5) before float_data (6), one fixed32 tag 0x35 per value
    unpacked = b"\x08\x01\x10\x02\x18\x02\x28\x02" + b"".join(b"\x35" + struct.pack("<f", v) for v in values)
    packed = b"\x08\x01\x10\x02\x18\x02\x32\x10" + struct.pack("<4f", *values) + b"\x28\x02"
    assert encode_datum(Datum(channels=1, height=2, width=2, float_data=values, label=2)) == unpacked
    for wire in (unpacked, packed):
        image, label = datum_to_image(decode_datum(wire))
        assert image.dtype == np.float32 and label == 2
        assert image[:, :, 0].tolist() == [[0.5, -1.25], [3.0, 4.5]]


def test_encoded_png_datum():
    rgb = np.random.default_rng(1).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    png = buf.getvalue()
    length = len(png)
    varint = bytes([length & 0x7F | 0x80, length >> 7]) if length >= 128 else bytes([length])
    wire = b"\x22" + varint + png + b"\x28\x03\x38\x01"  # what ReadFileToDatum + encoded=true writes
    datum = decode_datum(wire)
    assert datum.encoded is True and datum.channels is None
    image, label = datum_to_image(datum)
    assert label == 3 and np.array_equal(image, rgb)


@pytest.mark.parametrize("wire, message", [
    (b"\x08\x01\x10\x02\x18\x03\x22\x06abc", "claims 6 bytes"),             # value cut short
    (b"\x08\x01\x10\x02\x18\x03\x22\x02ab\x28\x01", r"channels\*height\*width is 6"),
    (b"\x08\x01\x10\x02\x18\x03\x28\x01", "neither data nor float_data"),
    (b"\x48\x01", "unexpected field 9"),
    (b"\x22\x03abc\x38\x01", "cannot be decoded"),                          # encoded garbage
    (b"\x08\xff", "varint runs past"),
])
def test_malformed_datums_are_errors(wire, message):
    with pytest.raises(DatumError, match=message):
        datum_to_image(decode_datum(wire))


@pytest.mark.parametrize("kernel", ["c", "numpy"])
def test_fast_codec_agrees_with_full_decode_and_falls_back(kernel):
    rng = np.random.default_rng(0)
    for shape in ((2, 3, 1), (4, 5, 3)):
        codec = RawDatumCodec(shape, kernel=kernel)
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        out = np.empty(shape, np.uint8)
        for label in (0, 5, 300, -2):
            assert codec.decode_into(encode_datum(image_to_datum(image, label)), out) == label
            assert np.array_equal(out, image)
        # without the explicit encoded=false Caffe writes: field order still decodes through the fallback
        wire = encode_datum(Datum(label=4, channels=shape[2], height=shape[0], width=shape[1],
                                  data=image_to_datum(image, 0).data))
        assert codec.decode_into(wire, out) == 4 and np.array_equal(out, image)
    with pytest.raises(DatumError, match="shape"):
        RawDatumCodec((2, 2, 1)).decode_into(encode_datum(image_to_datum(np.zeros((3, 3, 1), np.uint8), 1)), out)


def test_keys_as_convert_imageset_writes_them():
    assert datum_key(12) == b"00000012"
    assert datum_key(3, "cat/1.jpg") == b"00000003_cat/1.jpg"


def test_mean_binaryproto_hand_built():
    # BlobProto{num=1 channels=3 height=1 width=2 data=[packed floats CHW, BGR]}
    values = [1.0, 2.0, 10.0, 20.0, 100.0, 200.0]  # B plane, G plane, R plane
    wire = b"\x08\x01\x10\x03\x18\x01\x20\x02\x2a\x18" + struct.pack("<6f", *values)
    mean = parse_blobproto_mean(wire)
    assert mean.shape == (1, 2, 3)
    assert mean[0, 0].tolist() == [100.0, 10.0, 1.0] and mean[0, 1].tolist() == [200.0, 20.0, 2.0]


@pytest.mark.parametrize("kernel, undecoded", [("c", []), ("numpy", [1, 2, 4])])
def test_batch_decode_handles_mixed_layouts_like_one_by_one(kernel, undecoded):
    rng = np.random.default_rng(5)
    shape = (3, 2, 3)
    codec = RawDatumCodec(shape, kernel=kernel)
    images = rng.integers(0, 256, (6, *shape), dtype=np.uint8)
    labels = [1, 200, 7, 127, 128, 0]
    values = [encode_datum(image_to_datum(x, y)) for x, y in zip(images, labels)]
    values[2] = values[2][:-2]  # no explicit encoded=false: a layout numpy's joined path leaves alone
    out, out_labels = np.empty_like(images), np.empty(6, np.int64)
    todo = codec.decode_batch(values, out, out_labels)
    assert todo == undecoded
    for j in todo:
        out_labels[j] = codec.decode_into(values[j], out[j])
    assert np.array_equal(out, images) and out_labels.tolist() == labels
