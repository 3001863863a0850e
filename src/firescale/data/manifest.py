"""manifest.json beside every dataset, and `verify`: re-hash the files and decode every record.

The manifest records, per split, the record count, per-file SHA-256 and size, and the name of a
checksum file holding one CRC-32 per record (of its (H, W, C) uint8 pixels then its int64 little-endian
label), so that a changed record is reported by key, not just as a changed file.  `request_sha256`
digests what was asked for and the source's content; ingest leaves a dataset alone when it matches.
"""
from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from firescale.errors import FirescaleError

MANIFEST = "manifest.json"
FORMAT = "firescale-dataset"
VERSION = 1
SPLITS = ("train", "test")


def sha256_file(path: Path, block: int = 4 << 20) -> str:
    """SHA-256 of a file's bytes, read sequentially in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def record_crc(image: np.ndarray, label: int) -> int:
    """CRC-32 of one record: its uint8 pixels in (H, W, C) order, then the label as int64 little-endian."""
    crc = zlib.crc32(np.ascontiguousarray(image).tobytes())
    return zlib.crc32(int(label).to_bytes(8, "little", signed=True), crc)


def split_files(split: str, fmt: str) -> str:
    """The file whose SHA-256 stands for a split in a format (for LMDB: data.mdb inside the directory)."""
    return {"lmdb": f"{split}.lmdb/data.mdb", "hdf5": f"{split}.h5"}[fmt]


def load_manifest(directory: str | Path) -> dict:
    """The parsed manifest.json of a dataset folder."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise FirescaleError(f"{path} does not exist; a finished dataset folder has a manifest.json") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise FirescaleError(f"{path} cannot be read as JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise FirescaleError(f"{path} is not a {FORMAT} manifest of version {VERSION}")
    check_manifest(manifest, path)
    return manifest


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_manifest(manifest: dict, path: Path) -> None:
    """Refuse a manifest whose keys the readers and `verify` use are missing or of another kind (one
    sentence naming the file and the key), so that none of them fails on it later with a KeyError."""
    def need(ok: object, key: str, expected: str) -> None:
        if not ok:
            raise FirescaleError(f"{path}: key {key!r} is missing or not {expected}; the file is damaged or was "
                                 f"not written by `firescale data ingest`")

    read: list[Any] = [manifest.get(k) for k in ("shape", "classes", "formats", "splits")]
    shape, classes, formats, splits = read
    need(isinstance(shape, list) and len(shape) == 3 and all(_whole(v) and 0 < v < 1 << 20 for v in shape),
         "shape", "[height, width, channels] of whole numbers above 0")
    need(isinstance(classes, list) and 0 < len(classes) and all(isinstance(c, str) for c in classes), "classes",
         "a list of class names")
    need(manifest.get("num_classes") == len(classes), "num_classes", f"the number of classes ({len(classes)})")
    need(isinstance(formats, list) and formats and all(f in ("lmdb", "hdf5") for f in formats), "formats",
         "a list of lmdb and hdf5")
    need(isinstance(splits, dict) and splits and set(splits) <= set(SPLITS), "splits",
         f"a mapping of {' and '.join(SPLITS)}")
    for split, info in splits.items():
        at = f"splits.{split}"
        need(isinstance(info, dict), at, "a mapping of records, checksums and files")
        need(_whole(info.get("records")) and 0 <= info["records"] < 1 << 40, f"{at}.records", "a record count")
        files = info.get("files")
        need(isinstance(files, dict), f"{at}.files", "a mapping of file names to their bytes and sha256")
        checksums = info.get("checksums")
        wanted = [checksums, *(split_files(split, fmt) for fmt in formats)]
        need(isinstance(checksums, str) and Path(checksums).name == checksums and checksums not in ("", ".", ".."),
             f"{at}.checksums", "the name of a file in the dataset's folder")
        for rel in wanted:
            entry = files.get(rel)
            need(isinstance(entry, dict) and _whole(entry.get("bytes")) and entry["bytes"] >= 0
                 and isinstance(entry.get("sha256"), str), f"{at}.files.{rel}", "its bytes and sha256")


def manifest_if_ingested(directory: str | Path) -> dict | None:
    """The manifest of a dataset folder, or None when it has none yet (before ingest, or an archival
    dataset known only by its size); a manifest that is there is read and checked as load_manifest does."""
    return load_manifest(directory) if (Path(directory) / MANIFEST).is_file() else None


@dataclass
class VerifyResult:
    """What verify checked."""

    directory: Path
    records: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def _check_exists(directory: Path, rel: str) -> None:
    if not (directory / rel).is_file():
        raise FirescaleError(f"{directory / rel} is missing; the manifest lists it")


def _check_size(directory: Path, rel: str, expected: dict) -> None:
    path = directory / rel
    size = path.stat().st_size
    if size != expected["bytes"]:
        kind = "truncated" if size < expected["bytes"] else "longer than recorded"
        raise FirescaleError(f"{path} is {kind}: {size} bytes, the manifest says {expected['bytes']}")


def _check_hash(directory: Path, rel: str, expected: dict) -> None:
    digest = sha256_file(directory / rel)
    if digest != expected["sha256"]:
        raise FirescaleError(f"{directory / rel} has SHA-256 {digest[:16]}..., the manifest says "
                             f"{expected['sha256'][:16]}...; the file has changed since ingest")


def _verify_lmdb(directory: Path, split: str, info: dict, shape: tuple, num_classes: int, crcs: np.ndarray) -> None:
    from firescale.caffe.datum import DatumError, datum_key, datum_to_image, decode_datum
    from firescale.data.lmdb_io import DATA_FILE, iter_lmdb

    where = directory / f"{split}.lmdb" / DATA_FILE
    count = 0
    for key, value in iter_lmdb(directory / f"{split}.lmdb"):
        name = key.decode(errors="replace")
        if count >= info["records"]:
            raise FirescaleError(f"{where} has an extra record key {name} beyond the {info['records']} listed")
        expected = datum_key(count)
        if key != expected:
            raise FirescaleError(f"{where} record key {expected.decode()} is missing (found {name} in its place)")
        try:
            image, label = datum_to_image(decode_datum(value))
        except DatumError as exc:
            raise FirescaleError(f"{where} record key {name} cannot be decoded: {exc}") from exc
        if image.shape != shape or image.dtype != np.uint8:
            raise FirescaleError(f"{where} record key {name} is {image.dtype} {image.shape}, expected uint8 {shape}")
        if not 0 <= label < num_classes:
            raise FirescaleError(f"{where} record key {name} has label {label}, allowed 0..{num_classes - 1}")
        if record_crc(image, label) != crcs[count]:
            raise FirescaleError(f"{where} record key {name} does not match its checksum: the record is corrupt")
        count += 1
    if count != info["records"]:
        raise FirescaleError(f"{where} holds {count} records, the manifest says {info['records']} "
                             f"(first missing key {datum_key(count).decode()})")


def _verify_hdf5(directory: Path, split: str, info: dict, shape: tuple, num_classes: int, crcs: np.ndarray) -> None:
    from firescale.data.hdf5_io import Hdf5Reader

    where = directory / f"{split}.h5"
    reader = Hdf5Reader(where)
    try:
        if reader.num_records != info["records"] or reader.shape != shape:
            raise FirescaleError(f"{where} holds {reader.num_records} records of {reader.shape}, the manifest "
                                 f"says {info['records']} of {shape}")
        block = 2048
        for start in range(0, reader.num_records, block):
            idx = np.arange(start, min(start + block, reader.num_records))
            images, labels = reader.read(idx)
            for j, i in enumerate(idx.tolist()):
                if not 0 <= labels[j] < num_classes:
                    raise FirescaleError(f"{where} record {i} has label {labels[j]}, allowed 0..{num_classes - 1}")
                if record_crc(images[j], labels[j]) != crcs[i]:
                    raise FirescaleError(f"{where} record {i} does not match its checksum: the record is corrupt")
    finally:
        reader.close()


def verify_dataset(directory: str | Path) -> VerifyResult:
    """Check every file and record a dataset's manifest lists; raise FirescaleError at the first problem."""
    directory = Path(directory)
    manifest = load_manifest(directory)
    shape = tuple(manifest["shape"])
    num_classes = len(manifest["classes"])
    result = VerifyResult(directory)
    for split, info in manifest["splits"].items():
        files = info["files"]
        crc_rel = info["checksums"]
        _check_exists(directory, crc_rel)
        _check_size(directory, crc_rel, files[crc_rel])
        _check_hash(directory, crc_rel, files[crc_rel])
        crcs = np.load(directory / crc_rel)
        if crcs.shape != (info["records"],):
            raise FirescaleError(f"{directory / crc_rel} holds {crcs.shape} checksums for {info['records']} records")
        for fmt in manifest["formats"]:
            rel = split_files(split, fmt)
            _check_exists(directory, rel)
            if fmt == "lmdb":
                _verify_lmdb(directory, split, info, shape, num_classes, crcs)
            else:
                _verify_hdf5(directory, split, info, shape, num_classes, crcs)
            _check_size(directory, rel, files[rel])  # every record is fine: a change outside them
            _check_hash(directory, rel, files[rel])
            result.files.append(rel)
        result.records[split] = info["records"]
    return result
