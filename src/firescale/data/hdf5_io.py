"""HDF5 datasets: our own layout (written and read) and Caffe's HDF5Data layout (read).

Our layout, version 1, one file per split:
    /data   uint8 (N, H, W, C), chunked one record per chunk, no compression, RGB or grey
    /label  int64 (N,)
    attributes of the file: layout = "firescale-hdf5", layout_version = 1, shape = (H, W, C),
        classes = JSON list of class names, num_classes, mean = per-channel mean of /data (0..255 scale)
Caffe's HDF5Data layer reads a text file listing .h5 paths, each with float32 /data (N, C, H, W) and
/label (N,) or (N, 1); channel order is whatever its writer used, so it is left as stored (the planes
are interleaved into (N, H, W, C) by the pixel kernel of .pixels).
Files are opened read-only with HDF5 file locking off, which shared filesystems often do not support.
Records of our layout (one unfiltered record per chunk) are copied out of a read-only map of the file
at the offsets of HDF5's chunk index; before each batch the file's size is checked against the end of
every chunk it needs, so a file cut short since it was opened is a named error, not a SIGBUS.  The
datasets are immutable once ingest renames them into place: a file truncated by another process during
a batch's copy is still a SIGBUS, the same exposure as LMDB's map.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np

from firescale.caffe.pixels import PIXELS_KERNEL, compiled_kernel, planar_to_hwc
from firescale.data.batch import batch_array
from firescale.data.mapped_file import MappedFile
from firescale.errors import FirescaleError

LAYOUT = "firescale-hdf5"
LAYOUT_VERSION = 1
GATHER_BYTES = 4096  # records up to this size are copied by one fancy-indexing gather per batch


def write_hdf5(path: str | os.PathLike[str], images: np.ndarray, labels: np.ndarray, classes: list[str]) -> None:
    """Write one split in our layout."""
    n, h, w, c = images.shape
    with h5py.File(path, "w", libver="latest") as f:
        data = f.create_dataset("data", shape=images.shape, dtype=np.uint8, chunks=(1, h, w, c))
        block = 4096
        for start in range(0, n, block):
            data[start:start + block] = images[start:start + block]
        f.create_dataset("label", data=labels.astype(np.int64))
        f.attrs["layout"] = LAYOUT
        f.attrs["layout_version"] = LAYOUT_VERSION
        f.attrs["shape"] = np.asarray((h, w, c), np.int64)
        f.attrs["classes"] = json.dumps(classes)
        f.attrs["num_classes"] = len(classes)
        f.attrs["mean"] = images.reshape(-1, c).mean(axis=0, dtype=np.float64) if n else np.zeros(c)


def _open(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise FirescaleError(f"{path} is not a readable HDF5 file ({exc})") from exc


class Hdf5Reader:
    """Random access to a split in our HDF5 layout."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.file = _open(self.path)
        if self.file.attrs.get("layout") != LAYOUT:
            raise FirescaleError(f"{self.path} lacks the attribute layout={LAYOUT!r}; "
                                 "for Caffe's HDF5Data layout pass the text file that lists the .h5 files")
        version = int(self.file.attrs.get("layout_version", -1))
        if version != LAYOUT_VERSION:
            raise FirescaleError(f"{self.path} has layout_version {version}; this firescale reads {LAYOUT_VERSION}")
        for name in ("data", "label"):
            if name not in self.file:
                raise FirescaleError(f"{self.path} has no dataset /{name}")
        self.data = self.file["data"]
        self.label = self.file["label"]
        self.shape = tuple(int(s) for s in self.file.attrs["shape"])
        self.classes = json.loads(self.file.attrs["classes"])
        self.num_records = int(self.data.shape[0])
        self.dtype = self.data.dtype
        if tuple(self.data.shape[1:]) != self.shape or self.label.shape != (self.num_records,):
            raise FirescaleError(f"{self.path}: /data {self.data.shape} and /label {self.label.shape} do not "
                                 f"match the shape attribute {self.shape}")
        self.labels = self.label[()]  # labels are small: read once
        # One uncompressed record per chunk: records are copied from the file's map into the batch.
        self._direct = (self.data.chunks == (1, *self.shape)
                        and self.data.id.get_create_plist().get_nfilters() == 0)
        self._chunk_offsets: np.ndarray | None = None
        self._mapped: MappedFile | None = None  # the file mapped read-only, once the chunk table is built
        self._windows: np.ndarray | None = None  # for small records: row k is the record-sized run at byte k

    def _chunk_table(self) -> np.ndarray:
        """File offset of each record's chunk (-1 where none was written), from HDF5's chunk index."""
        if self._chunk_offsets is None:
            offsets = np.full(self.num_records, -1, np.int64)
            size = int(np.prod(self.shape)) * self.dtype.itemsize
            bad: list[str] = []

            def visit(info) -> None:
                if info.size != size or info.filter_mask:
                    bad.append(f"record {info.chunk_offset[0]}: chunk of {info.size} bytes, filter mask "
                               f"{info.filter_mask}; expected {size} unfiltered bytes")
                offsets[info.chunk_offset[0]] = info.byte_offset

            dsid = self.data.id
            if hasattr(dsid, "chunk_iter"):
                dsid.chunk_iter(visit)
            else:
                for k in range(dsid.get_num_chunks()):
                    visit(dsid.get_chunk_info(k))
            if bad:
                raise FirescaleError(f"{self.path} {bad[0]}")
            self._mapped = MappedFile(self.path)
            data = self._mapped.bytes
            if size <= GATHER_BYTES and len(data) >= size:
                self._windows = np.lib.stride_tricks.as_strided(data, (len(data) - size + 1, size), (1, 1),
                                                                writeable=False)
            self._chunk_offsets = offsets
        return self._chunk_offsets

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(images (N, H, W, C), labels int64) of the records at `indices`, in that order.

        With `out` (an (N, H, W, C) array of the reader's dtype) the images are written there.
        """
        indices = np.asarray(indices, np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_records):
            raise FirescaleError(f"{self.path}: record index out of range 0..{self.num_records - 1}")
        images = batch_array(out, len(indices), self.shape, self.dtype)
        if self._direct:
            self._read_chunks(indices, images)
        else:
            order = np.argsort(indices, kind="stable")
            uniq, inverse = np.unique(indices[order], return_inverse=True)
            block = self.data[uniq]
            images[order] = block[inverse]
        return images, self.labels[indices].astype(np.int64)

    def _read_chunks(self, indices: np.ndarray, images: np.ndarray) -> None:
        """Copy each record's chunk from the map into its row of `images`, after checking the file's size."""
        offsets = self._chunk_table()[indices]
        if not len(offsets):
            return
        if offsets.min() < 0:
            i = int(indices[np.argmin(offsets)])
            raise FirescaleError(f"{self.path} record {i}: its chunk was never written")
        size = images[0].nbytes
        data = self._mapped.bytes
        ends = offsets + size
        short = self._mapped.short_record(offsets, ends)
        if short is not None:
            j, why = short
            raise FirescaleError(f"{self.path} record {int(indices[j])}: its chunk needs bytes {int(offsets[j])}.."
                                 f"{int(ends[j])} but {why}")
        rows = images.view(np.uint8).reshape(len(offsets), size)
        if PIXELS_KERNEL == "c":  # one C call: a memcpy per record, bounds-checked against the map
            compiled_kernel().gather(data, offsets, rows)
            return
        if self._windows is not None:  # small records: one gather, a run of bytes per record
            rows[...] = self._windows[offsets]
            return
        for j, offset in enumerate(offsets.tolist()):  # straight into each record's row, in batch order
            rows[j] = data[offset:offset + size]

    def close(self) -> None:
        self._windows = None  # release numpy's hold on the map before closing it
        if self._mapped is not None:
            self._mapped.close()
            self._mapped = None
        self.file.close()


class CaffeHdf5Reader:
    """Caffe's HDF5Data layout: a text file listing .h5 files of float32 NCHW /data and /label."""

    def __init__(self, list_file: str | os.PathLike[str]) -> None:
        self.path = Path(list_file)
        try:
            lines = [ln.strip() for ln in self.path.read_text().splitlines() if ln.strip()]
        except OSError as exc:
            raise FirescaleError(f"{self.path} cannot be read ({exc.strerror})") from exc
        if not lines:
            raise FirescaleError(f"{self.path} lists no .h5 files")
        self.files: list[Path] = []
        datas, labels = [], []
        for line in lines:
            p = Path(line)
            if not p.is_absolute() and not p.exists():
                p = self.path.parent / p
            f = _open(p)
            if "data" not in f or "label" not in f:
                raise FirescaleError(f"{p} (listed in {self.path}) needs datasets /data and /label")
            data, label = f["data"], f["label"]
            if data.ndim != 4 or label.shape[0] != data.shape[0]:
                raise FirescaleError(f"{p}: /data must be (N, C, H, W) and /label (N,) or (N, 1), "
                                     f"got {data.shape} and {label.shape}")
            self.files.append(p)
            datas.append(data)
            labels.append(np.asarray(label[()]).reshape(data.shape[0], -1)[:, 0])
        shapes = {tuple(d.shape[1:]) for d in datas}
        if len(shapes) != 1:
            raise FirescaleError(f"the files listed in {self.path} have different record shapes {sorted(shapes)}")
        c, h, w = shapes.pop()
        self.shape = (h, w, c)
        self.datas = datas
        self.offsets = np.cumsum([0] + [d.shape[0] for d in datas])
        self.num_records = int(self.offsets[-1])
        self.labels = np.concatenate(labels).astype(np.int64)
        self.dtype = np.dtype(np.float32)

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(images (N, H, W, C) float32, labels) of the records at `indices`, in that order."""
        indices = np.asarray(indices, np.int64)
        images = batch_array(out, len(indices), self.shape, np.dtype(np.float32))
        which = np.searchsorted(self.offsets, indices, side="right") - 1
        for k in np.unique(which):
            sel = np.nonzero(which == k)[0]
            local = indices[sel] - self.offsets[k]
            order = np.argsort(local)
            uniq, inverse = np.unique(local[order], return_inverse=True)
            planar = np.ascontiguousarray(self.datas[k][uniq], np.float32)
            if len(uniq) == len(indices) and np.array_equal(sel[order], np.arange(len(indices))):
                planar_to_hwc(planar, images, bgr=False)  # one file, increasing indices: straight into the batch
                continue
            block = np.empty((len(uniq), *self.shape), np.float32)
            planar_to_hwc(planar, block, bgr=False)
            images[sel[order]] = block[inverse]
        return images, self.labels[indices]
