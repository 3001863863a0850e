"""Caffe's weights files: a .caffemodel (NetParameter, binary protobuf) or a .caffemodel.h5, read and written.

Weights are {layer name: [blob arrays in Caffe's shapes]}, in the file's order.  A blob keeps its
values bit for bit: `data` is read as float32, `double_data` as float64, and written back the same way.
Files are read with the protobuf package.  They are written with it too, except that each blob's
values are appended as one packed field of raw little-endian floats (the bytes protobuf itself would
write), so that a net of 100 million parameters is written in seconds, not one Python float at a time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from firescale.atomic import atomic_path
from firescale.caffe.proto import BlobProto, LayerParameter, NetParameter
from firescale.caffe.wire import length_delimited
from firescale.errors import FirescaleError
from firescale.hdf5errors import H5_ERRORS, damaged
from firescale.userfile import read_user_bytes

Blobs = dict[str, list[np.ndarray]]
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path: str | Path) -> bool:
    """True when the file starts with HDF5's signature (Caffe's own test: H5Fis_hdf5)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    except OSError as exc:
        raise FirescaleError(f"cannot read {path}: {exc.strerror}") from None


# ------------------------------------------------------------------ blobs
def blob_shape(blob: Any) -> tuple[int, ...]:
    """A BlobProto's shape: `shape`, or the deprecated num/channels/height/width as Caffe's LegacyShape."""
    if any(blob.HasField(key) for key in ("num", "channels", "height", "width")):
        return (blob.num, blob.channels, blob.height, blob.width)
    return tuple(int(d) for d in blob.shape.dim)


def blob_array(blob: Any, where: str) -> np.ndarray:
    """The values of a BlobProto in its shape (float32 `data`, or float64 `double_data`)."""
    shape = blob_shape(blob)
    double = len(blob.double_data) > 0 and len(blob.data) == 0
    source, dtype = (blob.double_data, np.float64) if double else (blob.data, np.float32)
    values = np.fromiter(source, dtype=dtype, count=len(source))   # twice as fast as np.array on a repeated field
    count = int(np.prod(shape, dtype=np.int64))
    if values.size != count:
        raise FirescaleError(f"{where} holds {values.size} values but its shape {shape} needs {count}: "
                             "the file is truncated or damaged")
    return values.reshape(shape)


def blob_bytes(array: np.ndarray) -> bytes:
    """A serialized BlobProto: its `shape`, and its values as packed `data` (float32) or `double_data` (float64)."""
    if array.dtype == np.float32:
        number, raw = 5, array.astype("<f4", copy=False).tobytes()
    elif array.dtype == np.float64:
        number, raw = 8, array.astype("<f8", copy=False).tobytes()
    else:
        raise ValueError(f"a Caffe blob holds float32 or float64 values, not {array.dtype}")
    blob = BlobProto()
    blob.shape.dim.extend(int(d) for d in array.shape)
    return blob.SerializeToString() + (length_delimited(number, raw) if raw else b"")


# ------------------------------------------------------------------ binary protobuf
def parse_message(message: Any, path: Path, what: str) -> Any:
    """Parse the file at `path` into `message` (a NetParameter or SolverState); one sentence when it fails."""
    from google.protobuf.message import DecodeError

    data = read_user_bytes(path, what)
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise FirescaleError(f"{path} cannot be read as a Caffe {what} (protobuf: {exc}): the file is truncated, "
                             "damaged or of another kind") from None
    return message


def read_caffemodel(path: str | Path) -> Blobs:
    """The blobs of every layer of a binary .caffemodel, `layer` and the old V1 `layers` alike."""
    path = Path(path)
    net = parse_message(NetParameter(), path, "NetParameter (.caffemodel)")
    layers = list(net.layer) + list(net.layers)
    if not layers:
        raise FirescaleError(f"{path} holds no layers: it is not a Caffe NetParameter (.caffemodel) with weights")
    out: Blobs = {}
    for layer in layers:
        if layer.name in out and (out[layer.name] or len(layer.blobs)):
            raise FirescaleError(f"{path}: layer {layer.name!r} appears twice; Caffe would copy only one of them")
        out[layer.name] = [blob_array(b, f"{path}: layer {layer.name!r} blob {i}") for i, b in enumerate(layer.blobs)]
    return out


def write_caffemodel(path: str | Path, blobs: Blobs, net_name: str = "",
                     types: dict[str, str] | None = None) -> Path:
    """Write `blobs` atomically as a binary NetParameter with one `layer` each (its `type` from `types`)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(NetParameter(name=net_name).SerializeToString())
        for name, arrays in blobs.items():   # one layer in memory at a time
            layer = LayerParameter(name=name, type=(types or {}).get(name, "")).SerializeToString()
            layer += b"".join(length_delimited(7, blob_bytes(array)) for array in arrays)
            fh.write(length_delimited(100, layer))
    return Path(path)


# ------------------------------------------------------------------ HDF5 (Caffe's Net::ToHDF5 layout)
def write_caffemodel_h5(path: str | Path, blobs: Blobs) -> Path:
    """Write `blobs` atomically as Caffe's HDF5 weights: dataset data/<layer>/<i> per blob."""
    import h5py

    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as fh:
            data = fh.create_group("data")
            for name, arrays in blobs.items():
                group = data.require_group(name)
                for i, array in enumerate(arrays):
                    group.create_dataset(str(i), data=array)
    return Path(path)


def read_caffemodel_h5(path: str | Path) -> Blobs:
    """The blobs of Caffe's HDF5 weights (data/<layer>/<i>); a layer name may hold '/' (a nested group)."""
    import h5py

    path = Path(path)
    try:
        with h5py.File(path, "r") as fh:
            data = fh.get("data")
            if not isinstance(data, h5py.Group):
                raise FirescaleError(f"{path} has no group 'data': it is not Caffe's HDF5 weights (.caffemodel.h5)")
            return _h5_layers(data, "", path)
    except H5_ERRORS as exc:
        raise damaged(path, "(Caffe's HDF5 weights)", exc) from None


def h5_blob(dataset: Any, where: str) -> np.ndarray:
    """One of Caffe's blobs stored as an HDF5 dataset: its float32 or float64 values in its shape."""
    import h5py

    if not isinstance(dataset, h5py.Dataset):
        raise FirescaleError(f"{where} is a group, not a dataset of a blob's values")
    array = np.asarray(dataset[()])
    if array.dtype.kind != "f":
        raise FirescaleError(f"{where} holds {array.dtype} values; a Caffe blob holds float32 or float64")
    return array


def _h5_layers(group: Any, prefix: str, path: Path) -> Blobs:
    import h5py

    out: Blobs = {}
    datasets = {k: v for k, v in group.items() if isinstance(v, h5py.Dataset)}
    if prefix and (datasets or not len(group)):
        if sorted(datasets) != sorted(str(i) for i in range(len(datasets))):
            raise FirescaleError(f"{path}: group data/{prefix} holds datasets {sorted(datasets)}, "
                                 "not Caffe's blobs 0, 1, ...")
        out[prefix] = [h5_blob(datasets[str(i)], f"{path}: data/{prefix}/{i}") for i in range(len(datasets))]
        return out
    for key, child in group.items():
        if isinstance(child, h5py.Group):
            out.update(_h5_layers(child, f"{prefix}/{key}" if prefix else key, path))
    return out


def read_weights(path: str | Path) -> Blobs:
    """Caffe's weights in either format, told apart by the HDF5 signature as Caffe does."""
    return read_caffemodel_h5(path) if is_hdf5(path) else read_caffemodel(path)
