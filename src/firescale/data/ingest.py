"""`firescale data ingest`: a source into train/test LMDB and HDF5 plus a manifest, atomically.

The dataset folder is built under a temporary sibling name and renamed into place only when every
file and the manifest are written, so an interrupted ingest never leaves a folder that looks finished
(a leftover `.NAME.tmp-*` is reported by the next ingest).  A finished dataset whose request digest
matches is left alone, so Snakemake can call ingest again at no cost.
"""
from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from firescale.atomic import atomic_path
from firescale.data.manifest import FORMAT, MANIFEST, VERSION, load_manifest, record_crc, sha256_file, split_files
from firescale.data.sources import SourceData
from firescale.errors import FirescaleError

FORMATS = ("lmdb", "hdf5")


@dataclass
class IngestResult:
    """Where the dataset is and whether this call wrote it."""

    path: Path
    written: bool
    manifest: dict


def parse_formats(text: str) -> list[str]:
    formats = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if not formats or bad:
        raise FirescaleError(f"--formats {text!r} must be a comma-separated subset of {', '.join(FORMATS)}")
    return sorted(set(formats), key=FORMATS.index)


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("firescale", "numpy", "lmdb", "h5py", "pillow", "scikit-learn"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def request_digest(source: SourceData, name: str, formats: list[str], options: dict) -> tuple[dict, str]:
    request = {"name": name, "formats": formats, "source": {"kind": source.kind, "location": source.location},
               "options": options, "content_sha256": source.content_sha256(), "layout_version": VERSION}
    blob = json.dumps(request, sort_keys=True).encode()
    return request, hashlib.sha256(blob).hexdigest()


def _write_split(folder: Path, split: str, images: np.ndarray, labels: np.ndarray, classes: list[str],
                 formats: list[str], on_record: Callable[[str, int], None] | None) -> dict:
    n = len(labels)
    files: dict[str, dict] = {}
    crcs = np.fromiter((record_crc(images[i], labels[i]) for i in range(n)), np.uint32, n)
    crc_rel = f"{split}.checksums.npy"
    np.save(folder / crc_rel, crcs)
    if "lmdb" in formats:   # lmdb and h5py are imported for their own format only: either may be absent
        from firescale.caffe.datum import datum_key, encode_datum, image_to_datum
        from firescale.data.lmdb_io import LmdbWriter

        estimated = n * (images[0].nbytes + 32) if n else 0
        with LmdbWriter(folder / f"{split}.lmdb", estimated_bytes=estimated) as writer:
            for i in range(n):
                writer.put(datum_key(i), encode_datum(image_to_datum(images[i], int(labels[i]))))
                if on_record is not None:
                    on_record(split, i)
    if "hdf5" in formats:
        from firescale.data.hdf5_io import write_hdf5

        write_hdf5(folder / f"{split}.h5", images, labels, classes)
    for rel in [crc_rel] + [split_files(split, f) for f in formats]:
        path = folder / rel
        files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    mean = images.reshape(-1, images.shape[-1]).mean(axis=0).tolist() if n else []
    return {"records": n, "files": files, "checksums": crc_rel, "mean": mean,
            "label_counts": np.bincount(labels, minlength=len(classes)).tolist()}


def ingest(source: SourceData, out: str | Path, name: str, formats: list[str], *, options: dict,
           command: str = "", on_record: Callable[[str, int], None] | None = None) -> IngestResult:
    """Write `source` as OUT/NAME with the given formats unless an identical dataset is already there."""
    out = Path(out)
    target = out / name
    if not name or "/" in name or name.startswith("."):
        raise FirescaleError(f"--name {name!r} must be a plain folder name")
    request, digest = request_digest(source, name, formats, options)
    if (target / MANIFEST).is_file():
        try:
            existing = load_manifest(target)
        except FirescaleError:
            existing = {}
        if existing.get("request_sha256") == digest:
            return IngestResult(target, False, existing)
    leftovers = sorted(p.name for p in out.glob(f".{name}.tmp-*")) if out.is_dir() else []
    if leftovers:
        print(f"firescale: note: {out} holds leftovers of interrupted ingests: {', '.join(leftovers)}",
              file=sys.stderr)
    shapes = {x.shape[1:] for x, _ in source.splits.values() if len(x)}
    if len(shapes) != 1:
        raise FirescaleError(f"source {source.location} gives records of shapes {sorted(shapes)}; one is required")
    shape = list(shapes.pop())
    for split, (_, labels) in source.splits.items():
        if not len(labels):
            raise FirescaleError(f"source {source.location} gives no records for the {split} split; every split "
                                 "needs one or more (for test: a --test-fraction that takes at least one image)")
        if (labels.min() < 0 or labels.max() >= len(source.classes)):
            raise FirescaleError(f"source {source.location} split {split} has labels outside "
                                 f"0..{len(source.classes) - 1}")
    with atomic_path(target, directory=True) as tmp:  # readable by all ranks as the umask allows
        splits = {split: _write_split(tmp, split, x, y, source.classes, formats, on_record)
                  for split, (x, y) in source.splits.items()}
        manifest = {
            "format": FORMAT, "version": VERSION, "name": name, "formats": formats,
            "shape": shape, "classes": source.classes, "num_classes": len(source.classes),
            "layout": {"lmdb": "Caffe Datum records, keys %08d, pixels CHW (BGR when 3 channels)",
                       "hdf5": "firescale-hdf5 v1: /data uint8 NHWC one record per chunk, /label int64"},
            "key_format": "%08d", "splits": splits,
            "source": {"kind": source.kind, "location": source.location, **source.notes},
            "request": request, "request_sha256": digest,
            "provenance": {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
                           "host": platform.node(), "versions": _versions()},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return IngestResult(target, True, manifest)
