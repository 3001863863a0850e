"""The readers the trainer uses: open a dataset, shard it across ranks, read ahead in a thread (any framework).

Contract (kept stable for the trainer):
    open_dataset(path, split, fmt=None) -> Dataset with .num_records, .shape (H, W, C), .num_classes,
        .manifest_sha256, .read(indices) -> (images NHWC, labels int64)
    Transform(scale=1/255, mean=None, crop=None, mirror=False)
    global_order(num_records, seed, epoch), shard_indices(num_records, seed, start_sample, global_batch,
        rank, size): the sharding policy, documented in firescale.data.shard
    train_batches(ds, transform, *, seed, rank, size, batch_per_rank, start_sample=0, prefetch=None)
    test_batches(ds, transform, *, rank, size, batch)
Images are uint8 for our datasets and Caffe's raw Datums, float32 for float Datums and Caffe HDF5.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from firescale.data.batch import BatchBuffer, batch_array
from firescale.data.manifest import MANIFEST, load_manifest
from firescale.data.prefetch import PrefetchedBatches
from firescale.data.shard import EpochOrders, global_order, rank_positions, shard_indices
from firescale.data.transforms import BatchTransformer, Transform
from firescale.errors import FirescaleError

__all__ = ["Dataset", "Transform", "global_order", "open_dataset", "shard_indices", "test_batches",
           "train_batches"]


@dataclass
class Dataset:
    """One split of a dataset in one format, readable by record index."""

    path: Path
    split: str
    fmt: str
    num_records: int
    shape: tuple[int, int, int]
    num_classes: int
    manifest_sha256: str | None
    classes: list[str]
    reader: Any

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.reader.dtype)

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(images (N, H, W, C), labels int64) of the records at `indices`, in that order.

        With `out`, a C-contiguous (N, H, W, C) array of `dtype`, the images are written into it and
        it is returned: a caller that is done with each batch before the next read reuses one array
        (fresh memory for every batch costs page faults that a 150 KB-per-record batch feels).
        """
        indices = np.asarray(indices, np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_records):
            raise FirescaleError(f"{self.path}: record indices must lie in 0..{self.num_records - 1}")
        if out is None:
            images, labels = self.reader.read(indices)
        else:
            images, labels = self.reader.read(indices, out=batch_array(out, len(indices), self.shape, self.dtype))
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            j = int(np.argmax((labels < 0) | (labels >= self.num_classes)))
            raise FirescaleError(f"{self._record(int(indices[j]))} has label {int(labels[j])}; the dataset's "
                                 f"{self.num_classes} classes are 0..{self.num_classes - 1}")
        return images, labels

    def _record(self, index: int) -> str:
        """The file and record of record `index`, as an error names them."""
        keys = getattr(self.reader, "keys", None)
        if keys is not None:
            from firescale.data.lmdb_pages import show_key

            return f"{self.reader.path / 'data.mdb'} record key {show_key(keys[index])}"
        files = getattr(self.reader, "files", None)
        if files is not None:
            k = int(np.searchsorted(self.reader.offsets, index, side="right") - 1)
            return f"{files[k]} record {index - int(self.reader.offsets[k])}"
        return f"{self.reader.path} record {index}"

    def close(self) -> None:
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()


def _classes_from_labels(labels: np.ndarray) -> list[str]:
    return [str(i) for i in range(int(labels.max()) + 1 if len(labels) else 0)]


def open_dataset(path: str | Path, split: str, fmt: str | None = None) -> Dataset:
    """Open split `split` of the dataset folder `path` (ours, a Caffe LMDB, or a Caffe HDF5 list file).

    `path` may be our dataset folder (manifest.json, SPLIT.lmdb, SPLIT.h5), an LMDB directory written by
    Caffe (holding data.mdb; `split` is then ignored), or a text file listing Caffe HDF5Data files.
    The format is LMDB when both exist, unless `fmt` is "lmdb" or "hdf5".
    """
    # Each format's reader is imported where it is used: a node with h5py and no lmdb reads HDF5 datasets.
    reader: Any
    path = Path(path)
    if fmt not in (None, "lmdb", "hdf5"):
        raise FirescaleError(f"format {fmt!r} is not lmdb or hdf5")
    if path.is_file():  # Caffe HDF5Data list
        from firescale.data.hdf5_io import CaffeHdf5Reader

        reader = CaffeHdf5Reader(path)
        return Dataset(path, split, "hdf5", reader.num_records, reader.shape,
                       len(_classes_from_labels(reader.labels)), None, _classes_from_labels(reader.labels), reader)
    if (path / "data.mdb").is_file():  # a bare Caffe LMDB
        from firescale.data.lmdb_io import LmdbReader

        reader = LmdbReader(path)
        labels = _scan_labels(reader)
        classes = _classes_from_labels(labels)
        return Dataset(path, split, "lmdb", len(reader.keys), reader.shape, len(classes), None, classes, reader)
    if not (path / MANIFEST).is_file():
        raise FirescaleError(f"{path} is neither a dataset folder with {MANIFEST}, an LMDB directory, nor a "
                             "Caffe HDF5 list file")
    manifest = load_manifest(path)
    digest = hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()
    if split not in manifest["splits"]:
        raise FirescaleError(f"{path / MANIFEST} has no split {split!r}; it has {', '.join(manifest['splits'])}")
    formats = manifest["formats"]
    chosen = fmt or ("lmdb" if "lmdb" in formats else "hdf5")
    if chosen not in formats:
        raise FirescaleError(f"{path / MANIFEST} lists formats {formats}, not {chosen}")
    info = manifest["splits"][split]
    shape = tuple(manifest["shape"])
    if chosen == "lmdb":
        from firescale.data.lmdb_io import LmdbReader

        reader = LmdbReader(path / f"{split}.lmdb", records=info["records"], shape=shape)
    else:
        from firescale.data.hdf5_io import Hdf5Reader

        reader = Hdf5Reader(path / f"{split}.h5")
        if reader.num_records != info["records"] or reader.shape != shape:
            reader.close()
            raise FirescaleError(f"{reader.path} holds {reader.num_records} records of {reader.shape}, "
                                 f"the manifest says {info['records']} of {shape}")
    return Dataset(path, split, chosen, info["records"], shape, len(manifest["classes"]), digest,
                   list(manifest["classes"]), reader)


def _scan_labels(reader: Any) -> np.ndarray:
    """Every label of a bare Caffe LMDB, each a whole number in 0..MAX_LABEL (its classes are 0..the largest)."""
    from firescale.data.labels import MAX_LABEL
    from firescale.data.lmdb_pages import show_key

    out = []
    for start in range(0, len(reader.keys), 4096):
        _, labels = reader.read(np.arange(start, min(start + 4096, len(reader.keys))))
        bad = (labels < 0) | (labels > MAX_LABEL)
        if bad.any():
            j = int(np.argmax(bad))
            key = show_key(reader.keys[start + j])
            raise FirescaleError(f"{reader.path / 'data.mdb'} record key {key} has label {int(labels[j])}; "
                                 f"allowed are whole numbers 0..{MAX_LABEL}")
        out.append(labels)
    return np.concatenate(out)


def iter_train_arrays(ds: Dataset, transform: Transform, *, seed: int, rank: int, size: int,
                      batch_per_rank: int, start_sample: int = 0,
                      batches_per_read: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The training batches of one rank as numpy arrays, forever (the generator behind train_batches);
    `batches_per_read` consecutive batches are read and transformed in one go and handed out in turn
    (the same arrays as one at a time: each sample's transform depends on its stream position only)."""
    transformer = BatchTransformer(transform, ds.shape)
    orders = EpochOrders(ds.num_records, seed)
    global_batch = batch_per_rank * size
    position = start_sample
    # The transformer copies each read, so one array serves every read (stand-ins without `out` also work).
    buffer = BatchBuffer(ds.shape, ds.dtype) if isinstance(ds, Dataset) else None
    while True:
        positions = np.concatenate([rank_positions(position + k * global_batch, global_batch, rank, size)
                                    for k in range(batches_per_read)])
        records = orders.records_at(positions)
        images, labels = ds.read(records, out=buffer.get(len(records))) if buffer else ds.read(records)
        images = transformer(images, train=True, seed=seed, positions=positions)
        for k in range(batches_per_read):
            mine = slice(k * batch_per_rank, (k + 1) * batch_per_rank)
            yield images[mine], labels[mine]
        position += global_batch * batches_per_read


def iter_test_arrays(ds: Dataset, transform: Transform, *, rank: int, size: int,
                     batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Records rank, rank+size, ... once, in batches of `batch`, centre-cropped and not mirrored."""
    transformer = BatchTransformer(transform, ds.shape)
    mine = np.arange(rank, ds.num_records, size, dtype=np.int64)
    for start in range(0, len(mine), batch):
        images, labels = ds.read(mine[start:start + batch])
        yield transformer(images, train=False), labels


PREFETCH_BYTES = 256 << 20
PREFETCH_MAX = 8


def prefetch_depth(batch: int, image_shape: tuple[int, ...]) -> int:
    """Batches to keep ready: as many as fit in PREFETCH_BYTES of float32, between 2 and PREFETCH_MAX.

    Two are enough when the reader always gets a core; on shared nodes it is preempted now and then
    for longer than a step, and a deeper queue, filled while it runs ahead, absorbs that.
    """
    batch_bytes = max(1, batch * int(np.prod(image_shape)) * 4)
    return int(min(PREFETCH_MAX, max(2, PREFETCH_BYTES // batch_bytes)))


def train_batches(ds: Dataset, transform: Transform, *, seed: int, rank: int, size: int, batch_per_rank: int,
                  start_sample: int = 0, prefetch: int | None = None):
    """(float32 NHWC images, int64 labels) NumPy batches for rank `rank`, endless, read ahead by a thread.

    `prefetch` batches are kept ready (default: prefetch_depth of the batch).  With `prefetch=0` the
    batches come as numpy arrays read in the caller's thread: a rank pinned to one core has no other
    core for a reader thread to run on, which would only take turns with the training thread for the
    core and the GIL.  Each backend copies the arrays to its own tensors (firescale.data.prefetch).
    """
    out_shape = BatchTransformer(transform, ds.shape).out_shape
    rank_positions(start_sample, batch_per_rank * size, rank, size)  # validate before the reader thread starts
    depth = prefetch if prefetch is not None else prefetch_depth(batch_per_rank, out_shape)

    def generate():
        return iter_train_arrays(ds, transform, seed=seed, rank=rank, size=size,
                                 batch_per_rank=batch_per_rank, start_sample=start_sample)

    if depth == 0:
        return generate()
    return PrefetchedBatches(generate(), depth)


def test_batches(ds: Dataset, transform: Transform, *, rank: int, size: int, batch: int, prefetch: int = 2):
    """NumPy batches over records rank::size once, centre crop, no mirror, read ahead by a thread."""
    if not 0 <= rank < size or batch < 1:
        raise FirescaleError(f"rank {rank} of {size} with batch {batch} is not a valid test reader")
    return PrefetchedBatches(iter_test_arrays(ds, transform, rank=rank, size=size, batch=batch), prefetch)


test_batches.__test__ = False  # type: ignore[attr-defined]  # a reader, not a pytest test, wherever tests import it


def describe(ds: Dataset) -> str:
    """One line for logs."""
    return json.dumps({"path": str(ds.path), "split": ds.split, "format": ds.fmt, "records": ds.num_records,
                       "shape": list(ds.shape), "classes": ds.num_classes})
