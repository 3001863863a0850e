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
from firescale.data.labels import check_labels
from firescale.data.mapped_file import MappedFile
from firescale.errors import FirescaleError
from firescale.hdf5errors import H5_ERRORS, damaged
from firescale.hdf5errors import first_line as _first_line
from firescale.userfile import read_user_text

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
        raise FirescaleError(f"{path} is not a readable HDF5 file ({_first_line(exc)})") from exc


def read_records(data: h5py.Dataset, indices: np.ndarray, path: Path, first: int = 0) -> np.ndarray:
    """data[indices] (increasing, unique); when HDF5 cannot read them, an error naming the first record it
    cannot read (numbered from `first`), found by reading them one at a time."""
    try:
        return data[indices]
    except H5_ERRORS as exc:
        error: BaseException = exc
    for i in indices.tolist():
        try:
            data[i]
        except H5_ERRORS as exc:
            raise damaged(path, f"record {first + i}", exc) from exc
    raise damaged(path, f"records {first + int(indices[0])}..{first + int(indices[-1])}", error) from error


class Hdf5Reader:
    """Random access to a split in our HDF5 layout."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.file = _open(self.path)
        try:
            self._read_layout()
        except BaseException:
            self.file.close()
            raise
        # One uncompressed record per chunk: records are copied from the file's map into the batch.
        self._chunk_offsets: np.ndarray | None = None
        self._mapped: MappedFile | None = None  # the file mapped read-only, once the chunk table is built
        self._windows: np.ndarray | None = None  # for small records: row k is the record-sized run at byte k

    def _attribute(self, name: str):
        try:
            return self.file.attrs[name] if name in self.file.attrs else None
        except H5_ERRORS as exc:
            raise damaged(self.path, f"attribute {name}", exc) from exc

    def _read_layout(self) -> None:
        """The attributes, datasets and labels of our layout, each checked; a damaged one is named."""
        if self._attribute("layout") != LAYOUT:
            raise FirescaleError(f"{self.path} lacks the attribute layout={LAYOUT!r}; "
                                 "for Caffe's HDF5Data layout pass the text file that lists the .h5 files")
        version = self._attribute("layout_version")
        if not isinstance(version, (int, np.integer)) or version != LAYOUT_VERSION:
            raise FirescaleError(f"{self.path} has layout_version {version}; this firescale reads {LAYOUT_VERSION}")
        shape = np.asarray(self._attribute("shape"))
        if shape.shape != (3,) or shape.dtype.kind not in "iu" or shape.min() < 1:
            raise FirescaleError(f"{self.path} has attribute shape {shape.tolist()}; it must be 3 positive "
                                 "whole numbers (height, width, channels)")
        self.shape = tuple(int(s) for s in shape)
        try:
            self.classes = json.loads(self._attribute("classes"))
        except (TypeError, ValueError) as exc:
            raise FirescaleError(f"{self.path} attribute classes is not a JSON list of class names ({exc})") from exc
        if not isinstance(self.classes, list) or not self.classes:
            raise FirescaleError(f"{self.path} attribute classes is not a JSON list of class names")
        for name in ("data", "label"):
            try:
                found = name in self.file and isinstance(self.file[name], h5py.Dataset)
            except H5_ERRORS as exc:
                raise damaged(self.path, f"dataset /{name}", exc) from exc
            if not found:
                raise FirescaleError(f"{self.path} has no dataset /{name}")
        try:
            self.data = self.file["data"]
            self.label = self.file["label"]
            data_shape, label_shape, self.dtype = self.data.shape, self.label.shape, self.data.dtype
        except H5_ERRORS as exc:
            raise damaged(self.path, "dataset /data or /label", exc) from exc
        self.num_records = int(data_shape[0]) if data_shape else 0
        if tuple(data_shape[1:]) != self.shape or label_shape != (self.num_records,) or self.dtype != np.uint8:
            raise FirescaleError(f"{self.path}: /data {self.dtype} {data_shape} and /label {label_shape} do not "
                                 f"match the shape attribute {self.shape} of uint8 records")
        try:
            labels = self.label[()]  # labels are small: read once
        except H5_ERRORS as exc:
            raise damaged(self.path, "dataset /label", exc) from exc
        self.labels = check_labels(labels, str(self.path), len(self.classes))
        try:
            self._direct = (self.data.chunks == (1, *self.shape)
                            and self.data.id.get_create_plist().get_nfilters() == 0)
        except H5_ERRORS as exc:
            raise damaged(self.path, "the storage of /data", exc) from exc

    def _chunk_table(self) -> np.ndarray:
        """File offset of each record's chunk (-1 where none was written), from HDF5's chunk index."""
        if self._chunk_offsets is None:
            offsets = np.full(self.num_records, -1, np.int64)
            size = int(np.prod(self.shape)) * self.dtype.itemsize
            bad: list[str] = []

            def visit(info) -> None:
                record = info.chunk_offset[0]
                if info.size != size or info.filter_mask or not 0 <= record < self.num_records:
                    bad.append(f"record {record}: chunk of {info.size} bytes, filter mask "
                               f"{info.filter_mask}; expected {size} unfiltered bytes of records "
                               f"0..{self.num_records - 1}")
                else:
                    offsets[record] = info.byte_offset

            dsid = self.data.id
            try:
                if hasattr(dsid, "chunk_iter"):
                    dsid.chunk_iter(visit)
                else:
                    for k in range(dsid.get_num_chunks()):
                        visit(dsid.get_chunk_info(k))
            except H5_ERRORS as exc:
                raise damaged(self.path, "the chunk index of /data", exc) from exc
            if bad:
                raise FirescaleError(f"{self.path} {bad[0]}")
            self._mapped = MappedFile(self.path)
            data = self._mapped.bytes
            if data is not None and size <= GATHER_BYTES and len(data) >= size:
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
            images[order] = read_records(self.data, uniq, self.path)[inverse]
        return images, self.labels[indices]

    def _read_chunks(self, indices: np.ndarray, images: np.ndarray) -> None:
        """Copy each record's chunk from the map into its row of `images`, after checking the file's size."""
        offsets = self._chunk_table()[indices]
        if not len(offsets):
            return
        if offsets.min() < 0:
            i = int(indices[np.argmin(offsets)])
            raise FirescaleError(f"{self.path} record {i}: its chunk was never written")
        size = images[0].nbytes
        if self._mapped is None or self._mapped.bytes is None:
            raise ValueError(f"{self.path} was closed before this read")
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
        lines = [ln.strip() for ln in read_user_text(self.path, "Caffe HDF5Data list").splitlines() if ln.strip()]
        if not lines:
            raise FirescaleError(f"{self.path} lists no .h5 files")
        self.files: list[Path] = []
        datas, labels = [], []
        self._handles: list[h5py.File] = []
        try:
            for line in lines:
                p = Path(line)
                if not p.is_absolute() and not p.exists():
                    p = self.path.parent / p
                if not p.is_file():
                    raise FirescaleError(f"{p} (listed in {self.path}) is not a file; the list names Caffe's .h5 "
                                         "files, one a line, relative to the list's folder or absolute")
                try:
                    self._handles.append(h5py.File(p, "r", locking=False))
                except OSError as exc:
                    raise FirescaleError(f"{p} (listed in {self.path}) is not a readable HDF5 file "
                                         f"({_first_line(exc)})") from exc
                data, label = self._datasets(self._handles[-1], p)
                self.files.append(p)
                datas.append(data)
                labels.append(label)
        except BaseException:
            self.close()
            raise
        shapes = {tuple(d.shape[1:]) for d in datas}
        if len(shapes) != 1:
            raise FirescaleError(f"the files listed in {self.path} have different record shapes {sorted(shapes)}")
        c, h, w = shapes.pop()
        self.shape = (h, w, c)
        self.datas = datas
        self.offsets = np.cumsum([0] + [d.shape[0] for d in datas])
        self.num_records = int(self.offsets[-1])
        self.labels = np.concatenate(labels)
        self.dtype = np.dtype(np.float32)

    def _datasets(self, f: h5py.File, p: Path) -> tuple[h5py.Dataset, np.ndarray]:
        """/data of one listed file and its labels, checked; a damaged part is named."""
        try:
            found = all(name in f and isinstance(f[name], h5py.Dataset) for name in ("data", "label"))
        except H5_ERRORS as exc:
            raise damaged(p, f"(listed in {self.path}) dataset /data or /label", exc) from exc
        if not found:
            raise FirescaleError(f"{p} (listed in {self.path}) needs datasets /data and /label")
        try:
            data, label = f["data"], f["label"]
            data_shape, label_shape, kind = data.shape, label.shape, data.dtype.kind
        except H5_ERRORS as exc:
            raise damaged(p, f"(listed in {self.path}) dataset /data or /label", exc) from exc
        if (len(data_shape) != 4 or min(data_shape[1:]) < 1 or kind not in "iuf" or not label_shape
                or label_shape[0] != data_shape[0] or int(np.prod(label_shape)) != data_shape[0]):
            raise FirescaleError(f"{p}: /data must be (N, C, H, W) numbers and /label (N,) or (N, 1), "
                                 f"got {data.dtype} {data_shape} and {label_shape}")
        try:
            labels = np.asarray(label[()]).reshape(-1)
        except H5_ERRORS as exc:
            raise damaged(p, f"(listed in {self.path}) dataset /label", exc) from exc
        return data, check_labels(labels, str(p))

    def close(self) -> None:
        for f in self._handles:
            f.close()
        self._handles = []

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
            planar = np.ascontiguousarray(read_records(self.datas[k], uniq, self.files[k]), np.float32)
            if len(uniq) == len(indices) and np.array_equal(sel[order], np.arange(len(indices))):
                planar_to_hwc(planar, images, bgr=False)  # one file, increasing indices: straight into the batch
                continue
            block = np.empty((len(uniq), *self.shape), np.float32)
            planar_to_hwc(planar, block, bgr=False)
            images[sel[order]] = block[inverse]
        return images, self.labels[indices]
