"""The protobuf wire format, just enough of it for Caffe's Datum and BlobProto records."""
from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def encode_varint(value: int) -> bytes:
    """Base-128 varint; negative int32/int64 values take ten bytes, as protobuf writes them."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read one varint at `pos`; return (value as unsigned, next position)."""
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise WireError("varint runs past the end of the message")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than ten bytes")


def as_int32(value: int) -> int:
    """Reinterpret an unsigned varint as the signed int32 protobuf meant."""
    value &= (1 << 64) - 1
    if value >= 1 << 63:
        value -= 1 << 64
    if not -(1 << 31) <= value < (1 << 31):
        raise WireError(f"value {value} does not fit an int32 field")
    return value


def tag(field: int, wire_type: int) -> bytes:
    """The key of a field: (field number << 3) | wire type, as a varint."""
    return encode_varint((field << 3) | wire_type)


def length_delimited(number: int, payload: bytes) -> bytes:
    """One length-delimited field (a message, a string or a packed repeated scalar): key, length, payload."""
    return tag(number, LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def iter_fields(buf: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """Yield (field number, wire type, value) for each field; length-delimited values are memoryviews."""
    view = memoryview(buf)
    pos = 0
    end = len(view)
    while pos < end:
        key, pos = decode_varint(view, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise WireError("field number 0 is not allowed")
        if wire_type == VARINT:
            value, pos = decode_varint(view, pos)
            yield field, wire_type, value
        elif wire_type == LENGTH_DELIMITED:
            length, pos = decode_varint(view, pos)
            if pos + length > end:
                raise WireError(f"field {field} claims {length} bytes but only {end - pos} remain")
            yield field, wire_type, view[pos:pos + length]
            pos += length
        elif wire_type == FIXED32:
            if pos + 4 > end:
                raise WireError(f"field {field} is cut short (fixed32)")
            yield field, wire_type, struct.unpack_from("<I", view, pos)[0]
            pos += 4
        elif wire_type == FIXED64:
            if pos + 8 > end:
                raise WireError(f"field {field} is cut short (fixed64)")
            yield field, wire_type, struct.unpack_from("<Q", view, pos)[0]
            pos += 8
        else:
            raise WireError(f"field {field} has unsupported wire type {wire_type}")
