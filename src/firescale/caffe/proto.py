"""The part of Caffe's caffe.proto that weights and solver states use, described for the protobuf package.

Names, numbers, types and labels are Caffe's (src/caffe/proto/caffe.proto, BVLC/caffe master
9b891540); `tests/caffe/test_caffemodel.py` checks every field here against that file.  Messages
and fields left out (the layer parameters, V1's `type` enum, ...) stay in a parsed message as unknown
fields, so a Caffe file of any vintage still parses.  The descriptor is built at import, in a pool of
its own: no protoc, no generated code, nothing to compile on a fresh clone.
"""
from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_TYPES = {"int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE,
          "string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL}

# message -> (label, type, name, number, packed); a type not in _TYPES is a message of this file.
FIELDS: dict[str, tuple[tuple[str, str, str, int, bool], ...]] = {
    "BlobShape": (
        ("repeated", "int64", "dim", 1, True),
    ),
    "BlobProto": (
        ("optional", "BlobShape", "shape", 7, False),
        ("repeated", "float", "data", 5, True),
        ("repeated", "float", "diff", 6, True),
        ("repeated", "double", "double_data", 8, True),
        ("repeated", "double", "double_diff", 9, True),
        ("optional", "int32", "num", 1, False),
        ("optional", "int32", "channels", 2, False),
        ("optional", "int32", "height", 3, False),
        ("optional", "int32", "width", 4, False),
    ),
    "NetParameter": (
        ("optional", "string", "name", 1, False),
        ("repeated", "LayerParameter", "layer", 100, False),
        ("repeated", "V1LayerParameter", "layers", 2, False),
    ),
    "LayerParameter": (
        ("optional", "string", "name", 1, False),
        ("optional", "string", "type", 2, False),
        ("repeated", "string", "bottom", 3, False),
        ("repeated", "string", "top", 4, False),
        ("repeated", "BlobProto", "blobs", 7, False),
    ),
    "V1LayerParameter": (
        ("repeated", "string", "bottom", 2, False),
        ("repeated", "string", "top", 3, False),
        ("optional", "string", "name", 4, False),
        ("repeated", "BlobProto", "blobs", 6, False),
    ),
    "SolverState": (
        ("optional", "int32", "iter", 1, False),
        ("optional", "string", "learned_net", 2, False),
        ("repeated", "BlobProto", "history", 3, False),
        ("optional", "int32", "current_step", 4, False),
    ),
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="firescale/caffe/caffe_weights.proto", package="caffe",
                                               syntax="proto2")
    for message, fields in FIELDS.items():
        desc = proto.message_type.add(name=message)
        for label, kind, name, number, packed in fields:
            field = desc.field.add(name=name, number=number, label=REPEATED if label == "repeated" else OPTIONAL)
            if kind in _TYPES:
                field.type = _TYPES[kind]
            else:
                field.type, field.type_name = _F.TYPE_MESSAGE, f".caffe.{kind}"
            if packed:
                field.options.packed = True
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.AddSerializedFile(_file_descriptor().SerializeToString())


def _message_class(name: str) -> Any:
    descriptor = _POOL.FindMessageTypeByName(f"caffe.{name}")
    get = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.21
    return get(descriptor) if get else message_factory.MessageFactory(_POOL).GetPrototype(descriptor)


BlobShape = _message_class("BlobShape")
BlobProto = _message_class("BlobProto")
NetParameter = _message_class("NetParameter")
LayerParameter = _message_class("LayerParameter")
SolverState = _message_class("SolverState")
