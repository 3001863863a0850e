"""Datasets made by Caffe's tools read back exactly: a convert_imageset-style LMDB and HDF5Data files."""
from __future__ import annotations

import io

import h5py
import lmdb
import numpy as np
from PIL import Image

from firescale.data.readers import Transform, open_dataset, test_batches


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def raw_datum_bytes(rgb: np.ndarray, label: int) -> bytes:
    """What CVMatToDatum + set_label serialize: channels, height, width, data (planar BGR), label, encoded."""
    h, w, c = rgb.shape
    data = rgb[:, :, ::-1].transpose(2, 0, 1).tobytes()
    return (b"\x08" + varint(c) + b"\x10" + varint(h) + b"\x18" + varint(w) + b"\x22" + varint(len(data)) + data
            + b"\x28" + varint(label) + b"\x38\x00")


def encoded_datum_bytes(png: bytes, label: int) -> bytes:
    """What ReadFileToDatum + encoded=true serialize: data (the file), label, encoded."""
    return b"\x22" + varint(len(png)) + png + b"\x28" + varint(label) + b"\x38\x01"


def test_convert_imageset_lmdb_reads_back_exactly(tmp_path):
    rng = np.random.default_rng(9)
    images = rng.integers(0, 256, (6, 5, 4, 3), dtype=np.uint8)
    labels = [3, 0, 2, 200, 1, 3]
    env = lmdb.open(str(tmp_path / "caffe_train_lmdb"), map_size=16 << 20)
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(zip(images, labels)):
            key = b"%08d_%s" % (i, f"class{label}/img{i}.png".encode())  # convert_imageset's key
            if i % 2:  # --encoded: the PNG file itself
                buf = io.BytesIO()
                Image.fromarray(image).save(buf, format="PNG")
                value = encoded_datum_bytes(buf.getvalue(), label)
            else:
                value = raw_datum_bytes(image, label)
            txn.put(key, value)
    env.close()
    ds = open_dataset(tmp_path / "caffe_train_lmdb", "train")
    assert (ds.fmt, ds.num_records, ds.shape, ds.num_classes, ds.manifest_sha256) == ("lmdb", 6, (5, 4, 3), 201, None)
    got, got_labels = ds.read(np.array([5, 0, 3, 1]))
    assert np.array_equal(got, images[[5, 0, 3, 1]]) and got_labels.tolist() == [3, 3, 200, 0]


def test_float_datum_lmdb_reads_as_float32(tmp_path):
    import struct

    env = lmdb.open(str(tmp_path / "floats"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for i in range(3):
            body = b"\x08\x01\x10\x01\x18\x02\x28" + varint(i) + b"".join(b"\x35" + struct.pack("<f", v)
                                                                         for v in (i + 0.5, -i))
            txn.put(b"%08d" % i, body)
    env.close()
    ds = open_dataset(tmp_path / "floats", "train")
    images, labels = ds.read(np.arange(3))
    assert images.dtype == np.float32 and images[:, 0, :, 0].tolist() == [[0.5, 0.0], [1.5, -1.0], [2.5, -2.0]]
    assert labels.tolist() == [0, 1, 2]


def test_caffe_hdf5data_list_reads_back(tmp_path):
    rng = np.random.default_rng(3)
    parts = []
    for k, n in enumerate((4, 3)):
        data = rng.random((n, 2, 3, 5), dtype=np.float32)  # N, C, H, W
        label = rng.integers(0, 4, (n, 1)).astype(np.float32)
        with h5py.File(tmp_path / f"part{k}.h5", "w") as f:
            f["data"] = data
            f["label"] = label
        parts.append((data, label[:, 0]))
    (tmp_path / "train.txt").write_text("part0.h5\npart1.h5\n")  # relative paths, as often written
    ds = open_dataset(tmp_path / "train.txt", "train")
    assert ds.num_records == 7 and ds.shape == (3, 5, 2)
    nhwc = np.concatenate([d for d, _ in parts]).transpose(0, 2, 3, 1)
    want = np.concatenate([lab for _, lab in parts]).astype(np.int64)
    idx = np.array([6, 0, 4, 3])
    images, labels = ds.read(idx)
    assert np.array_equal(images, nhwc[idx]) and np.array_equal(labels, want[idx])
    batches = list(test_batches(ds, Transform(scale=1.0), rank=0, size=1, batch=4))
    assert np.allclose(np.concatenate([x for x, _ in batches]), nhwc)
