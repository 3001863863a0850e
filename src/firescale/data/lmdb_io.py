"""LMDB environments of Caffe Datums: writing them as convert_imageset does, reading them safely.

Readers open with readonly=True, lock=False and readahead=False.  Read-only with no lock file means
no writes at all to a shared filesystem (Lustre and GPFS handle the shared-memory reader table in
lock.mdb badly, and many ranks would contend on it); it is safe because nothing writes a dataset
once ingest has renamed it into place.  Without readahead the kernel reads only the pages a record
touches: with random access by many ranks, readahead would fetch neighbouring pages that this rank
never uses and multiply the traffic to the file servers.

LMDB trusts its pages: a damaged page number sends it past the end of the file (SIGBUS), a damaged
page header trips its assertions (SIGABRT).  So before LMDB maps data.mdb, the file is checked with
plain reads (lmdb_pages.value_index): both meta pages, that the file holds every page in use, and
every branch and leaf page a lookup or a cursor could touch; whatever bytes the file holds, opening it
reads or stops with one sentence naming the file and a key.  A finished dataset is immutable, so the
same walk gives the file offset and length of every value for LmdbReader.  When the keys are the
dense "%08d" indices ingest writes and the pixels are uint8, a batch is then one fancy index into those
arrays and one call of the compiled kernel over a read-only map of data.mdb: no LMDB lookup and no
Python per record.  The file's size is checked before every batch, so a file cut short after open is
an error naming the first lost key, never a SIGBUS.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from struct import error as struct_error

import lmdb
import numpy as np

from firescale.caffe.datum import (
    DatumError,
    RawDatumCodec,
    datum_key,
    datum_to_image,
    decode_datum,
    encode_datum,
    image_to_datum,
)
from firescale.caffe.pixels import PIXELS_KERNEL, compiled_kernel
from firescale.data.batch import batch_array
from firescale.data.lmdb_pages import ValueIndex, show_key
from firescale.data.mapped_file import MappedFile
from firescale.errors import FirescaleError

DATA_FILE = "data.mdb"


class LmdbWriter:
    """Append raw Datums under keys "%08d" to a new LMDB environment directory."""

    def __init__(self, path: str | os.PathLike[str], *, estimated_bytes: int, commit_every: int = 1000) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.map_size = max(64 << 20, int(estimated_bytes * 2))
        self.env = lmdb.open(str(self.path), map_size=self.map_size, subdir=True, meminit=False,
                             map_async=False, sync=True)
        self.commit_every = commit_every
        self.count = 0
        self._txn = self.env.begin(write=True)

    def put(self, key: bytes, value: bytes) -> None:
        try:
            self._txn.put(key, value, append=True)
        except lmdb.MapFullError:
            self._txn.abort()
            raise
        self.count += 1
        if self.count % self.commit_every == 0:
            self._txn.commit()
            self._txn = self.env.begin(write=True)

    def put_image(self, index: int, image: np.ndarray, label: int) -> None:
        from firescale.caffe.datum import datum_key

        self.put(datum_key(index), encode_datum(image_to_datum(image, label)))

    def close(self) -> None:
        self._txn.commit()
        self.env.sync(True)
        self.env.close()

    def __enter__(self) -> LmdbWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._txn.abort()
            self.env.close()


def open_lmdb_readonly(path: str | os.PathLike[str]) -> tuple[lmdb.Environment, ValueIndex]:
    """Check data.mdb with plain reads, then open the directory read-only, lock-free, without readahead.

    Returns the environment and the value index of the check (lmdb_pages.value_index): every page
    LMDB may touch is known to lie inside the file and to be laid out as LMDB expects before LMDB
    maps it, so a damaged or short file is an error naming the file and a key, never a SIGBUS or an
    abort inside LMDB.
    """
    path = Path(path)
    data = path / DATA_FILE
    if not data.is_file():
        raise FirescaleError(f"{data} does not exist; an LMDB dataset is a directory holding {DATA_FILE}")
    index = checked_index(data)
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, subdir=True,
                        max_readers=1, max_spare_txns=1)
    except lmdb.Error as exc:
        raise FirescaleError(f"{data} is not a readable LMDB environment ({exc})") from exc
    return env, index


def checked_index(data: Path) -> ValueIndex:
    """The value index of data.mdb from the walk that checks it; what is wrong, in one sentence naming a key."""
    from firescale.data.lmdb_pages import LayoutError, TreePageError, TruncatedError, value_index

    try:
        return value_index(data)
    except OSError as exc:
        raise FirescaleError(f"{data} cannot be read ({exc.strerror or exc})") from exc
    except TruncatedError as exc:
        raise FirescaleError(f"{data} is truncated: {exc.size} bytes but its pages need {exc.needed}; "
                             + _describe_lost(data)) from exc
    except TreePageError as exc:
        key = show_key(exc.first_key)
        where = f"from record key {key} on" if key else "from the first record on"
        raise FirescaleError(f"{data} cannot be read {where}: {exc}; the file is corrupt") from exc
    except LayoutError as exc:
        raise FirescaleError(f"{data} is not the LMDB environment of a dataset: {exc}") from exc


def _bytes_needed(env: lmdb.Environment) -> int:
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def _describe_lost(data: Path) -> str:
    """Which records a short data.mdb lost, found by walking its B-tree with plain reads."""
    from firescale.data.lmdb_pages import LayoutError, lost_records

    try:
        lost = lost_records(data)
    except (LayoutError, OSError, struct_error) as exc:
        return f"records stored past the end cannot be read (their keys cannot be listed: {exc})"
    if lost is None:
        return "every record is whole, but pages LMDB may touch lie past the end"
    key = show_key(lost.first_key)
    if lost.subtree:
        first = (f"the tree page holding the records from key {key} on" if key
                 else "the tree page holding the first records") + " lies past the end"
    else:
        first = f"record key {key} needs bytes up to {lost.first_end}"
    more = f" ({lost.count} records or tree pages lie past the end in all)" if lost.count > 1 else ""
    return f"{first}{more}"


def lmdb_record_error(data: Path, key: bytes, exc: lmdb.Error, env: lmdb.Environment | None = None) -> FirescaleError:
    """The error for a record LMDB cannot read (page not found, corrupted, bad transaction)."""
    name = show_key(key) or "(first)"
    message = f"{data} record key {name} cannot be read: LMDB reports {exc}"
    try:
        have = data.stat().st_size
        needed = _bytes_needed(env) if env is not None else have
    except (OSError, lmdb.Error):
        return FirescaleError(message)
    if have < needed:
        message += f"; the file is truncated: {have} bytes but its pages need {needed}"
    return FirescaleError(message)


def iter_lmdb(path: str | os.PathLike[str]) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) in key order; the environment is checked and opened read-only as above."""
    env, _ = open_lmdb_readonly(path)
    last = b""
    try:
        with env.begin() as txn:
            cursor = txn.cursor()
            try:
                for key, value in cursor:
                    last = key
                    yield key, value
            except lmdb.Error as exc:
                error = lmdb_record_error(Path(path) / DATA_FILE, last, exc, env)
                raise FirescaleError(str(error).replace(" record key ", " record after key ", 1)
                                     if last else str(error)) from exc
    finally:
        env.close()


class LmdbReader:
    """Random access to the Datums of one LMDB by record index."""

    def __init__(self, path: str | os.PathLike[str], *, keys: list[bytes] | None = None,
                 shape: tuple[int, int, int] | None = None, index: bool = True, records: int | None = None) -> None:
        """`index=False` keeps every read going through LMDB's lookups (to compare or to test them).  `records`
        (a manifest's count) reads records 0..records-1 by ingest's keys, once the tree holds that many."""
        self.path = Path(path)
        self.env, found = open_lmdb_readonly(self.path)
        if records is not None:
            if records != len(found.keys):
                self.env.close()
                raise FirescaleError(f"{self.path / DATA_FILE} holds {len(found.keys)} records, the manifest says "
                                     f"{records}")
            keys = [datum_key(i) for i in range(records)]
        if keys is None:
            keys = found.keys
        self.keys = keys
        if not keys:
            raise FirescaleError(f"{self.path / DATA_FILE} holds no records")
        first, _ = self.decode(keys[0], self._get(keys[0]))
        self.dtype = first.dtype
        self.shape = tuple(shape) if shape else tuple(first.shape)
        if first.shape != self.shape:
            raise FirescaleError(f"{self.path / DATA_FILE} record key {show_key(keys[0])} has shape "
                                 f"{first.shape}, expected {self.shape}")
        h, w, c = self.shape
        self.codec = RawDatumCodec((h, w, c))
        self._mapped: MappedFile | None = None
        self._offsets: np.ndarray | None = None
        self._lengths: np.ndarray | None = None
        if (index and self.dtype == np.uint8 and PIXELS_KERNEL == "c"
                and (keys is found.keys or keys == found.keys)
                and keys == [datum_key(i) for i in range(len(keys))]):
            self._mapped = MappedFile(self.path / DATA_FILE)
            self._offsets, self._lengths = found.offsets, found.lengths

    @property
    def indexed(self) -> bool:
        """True when batches are read through the value index and the compiled kernel."""
        return self._mapped is not None

    def _get(self, key: bytes) -> bytes:
        with self.env.begin() as txn:
            return self._get_all(txn, [key])[0]

    def decode(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        """(image, label) of one record; an undecodable record is an error naming file and key."""
        try:
            return datum_to_image(decode_datum(value))
        except DatumError as exc:
            raise FirescaleError(f"{self.path / DATA_FILE} record key {show_key(key)}: {exc}") from exc

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(images (N, H, W, C), labels int64) of the records at `indices`, in that order.

        With `out` (an (N, H, W, C) array of the reader's dtype) the images are written there, so a
        caller that consumes each batch before the next read can reuse one array.
        """
        n = len(indices)
        images = batch_array(out, n, self.shape, self.dtype)
        labels = np.empty(n, np.int64)
        if self._mapped is not None:
            return self._read_indexed(np.asarray(indices, np.int64), images, labels)
        keys = [self.keys[i] for i in indices.tolist()]
        # buffers=True: values are views into the memory map, valid inside the transaction; decoding
        # copies the pixels straight from them into `images`, one copy per record.
        with self.env.begin(buffers=True) as txn:
            values = self._get_all(txn, keys)
            todo = self.codec.decode_batch(values, images, labels) if self.dtype == np.uint8 else range(n)
            values = [values[j].tobytes() for j in todo]  # the few left for one-by-one decoding
        todo_values = dict(zip(todo, values))
        for j in todo:
            key = keys[j]
            try:
                if self.dtype == np.uint8:
                    labels[j] = self.codec.decode_into(todo_values[j], images[j])
                    continue
                image, labels[j] = datum_to_image(decode_datum(todo_values[j]))
            except DatumError as exc:
                raise FirescaleError(f"{self.path / DATA_FILE} record key {show_key(key)}: "
                                     f"{exc}") from exc
            if image.shape != self.shape:
                raise FirescaleError(f"{self.path / DATA_FILE} record key {show_key(key)} has shape "
                                     f"{image.shape}, expected {self.shape}")
            images[j] = image
        return images, labels

    def _read_indexed(self, indices: np.ndarray, images: np.ndarray,
                      labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One gather through the value index: check the file still holds every record, then one C call."""
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self.keys)):
            raise FirescaleError(f"{self.path / DATA_FILE}: record index out of range 0..{len(self.keys) - 1}")
        if self._mapped is None or self._mapped.map is None or self._offsets is None or self._lengths is None:
            raise ValueError(f"{self.path / DATA_FILE} has no value index to read through")
        offsets = self._offsets[indices]
        lengths = self._lengths[indices]
        if not len(indices):
            return images, labels
        ends = offsets + lengths
        short = self._mapped.short_record(offsets, ends)
        if short is not None:
            j, why = short
            shown = show_key(self.keys[int(indices[j])])
            raise FirescaleError(f"{self.path / DATA_FILE} record key {shown} needs bytes {int(offsets[j])}.."
                                 f"{int(ends[j])} but {why}")
        h, w, c = self.shape
        mapped = self._mapped.map
        todo = compiled_kernel().decode_raw_datums_at(mapped, offsets, lengths, self.codec.header, images,
                                                      labels, c, h, w, reverse=c == 3)
        for j in todo:  # laid out otherwise: the full decoder, one by one
            key = self.keys[int(indices[j])]
            value = mapped[int(offsets[j]):int(ends[j])]
            try:
                labels[j] = self.codec.decode_into(value, images[j])
            except DatumError as exc:
                raise FirescaleError(f"{self.path / DATA_FILE} record key {show_key(key)}: "
                                     f"{exc}") from exc
        return images, labels

    def _get_all(self, txn: lmdb.Transaction, keys: list[bytes]) -> list:
        """The values of `keys`; a missing record or one LMDB cannot reach is an error naming its key."""
        get = txn.get
        values = []
        key = b""
        try:
            for key in keys:
                value = get(key)
                if value is None:
                    name = show_key(key)
                    raise FirescaleError(f"{self.path / DATA_FILE} has no record with key {name}")
                values.append(value)
        except lmdb.Error as exc:
            raise lmdb_record_error(self.path / DATA_FILE, key, exc, self.env) from exc
        return values

    def close(self) -> None:
        if self._mapped is not None:
            self._mapped.close()
            self._mapped = None
        self.env.close()
