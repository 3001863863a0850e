"""Where datasets come from: scikit-learn's digits, IDX files (MNIST, Fashion-MNIST), image folders.

Every source yields a SourceData: uint8 (N, H, W, C) images and int64 labels for train and test.
- digits: sklearn.datasets.load_digits, 1,797 8x8 grey images with values 0..16, scaled to 0..255 as
  round(v * 255 / 16) so that the full range is used; split by --test-fraction, stratified by class.
- idx:DIR: train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
  t10k-labels-idx1-ubyte[.gz]; the files' own train/test split is kept.  Class names come from a
  classes.txt in DIR (one per line), else Fashion-MNIST's when DIR's name says fashion-mnist, else 0..9.
- folder:DIR: one subfolder per class (sorted names are the classes, label = position), JPEG/PNG/BMP/GIF
  files decoded with Pillow to RGB (or grey when every image is grey), resized by --resize HxW
  (required when sizes differ); split by --test-fraction, stratified by class.
"""
from __future__ import annotations

import gzip
import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from firescale.errors import FirescaleError

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                   "Bag", "Ankle boot"]
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif"}
IDX_TYPES: dict[int, DTypeLike] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass
class SourceData:
    """Images and labels of both splits, with what the manifest says about where they came from."""

    kind: str
    location: str
    classes: list[str]
    splits: dict[str, tuple[np.ndarray, np.ndarray]]
    notes: dict[str, object] = field(default_factory=dict)

    def content_sha256(self) -> str:
        """A digest of the images, labels and class names, to recognise an unchanged ingest."""
        h = hashlib.sha256()
        h.update("\n".join(self.classes).encode())
        for split in sorted(self.splits):
            images, labels = self.splits[split]
            h.update(split.encode() + str(images.shape).encode())
            h.update(np.ascontiguousarray(images).tobytes())
            h.update(labels.astype("<i8").tobytes())
        return h.hexdigest()


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) record indices; each class gives round(fraction * count) records to test."""
    if not 0 <= test_fraction < 1:
        raise FirescaleError(f"--test-fraction must be in [0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    test = []
    for cls in np.unique(labels):
        members = np.nonzero(labels == cls)[0]
        take = int(round(test_fraction * len(members)))
        test.append(rng.permutation(members)[:take])
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)
    return train_idx, test_idx


def load_digits_source(test_fraction: float, seed: int) -> SourceData:
    """scikit-learn's 8x8 digits, scaled from 0..16 to 0..255."""
    import sklearn
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[:, :, :, None]
    labels = bunch.target.astype(np.int64)
    train, test = stratified_split(labels, test_fraction, seed)
    return SourceData("digits", f"sklearn.datasets.load_digits (scikit-learn {sklearn.__version__})",
                      [str(d) for d in range(10)],
                      {"train": (images[train], labels[train]), "test": (images[test], labels[test])},
                      {"scaling": "pixel = round(v * 255 / 16) for digits values v in 0..16",
                       "test_fraction": test_fraction, "split_seed": seed})


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (as MNIST ships it), gzipped or not."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise FirescaleError(f"{path} cannot be read as a (gzipped) IDX file ({exc})") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise FirescaleError(f"{path} does not start with an IDX magic number (0x00 0x00 type ndim)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise FirescaleError(f"{path} is cut short inside its IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dtype = np.dtype(IDX_TYPES[raw[2]])
    count = int(np.prod(dims))
    body = raw[4 + 4 * ndim:]
    if len(body) != count * dtype.itemsize:
        raise FirescaleError(f"{path} holds {len(body)} data bytes, its header {dims} needs {count * dtype.itemsize}")
    return np.frombuffer(body, dtype).reshape(dims)


def _find_idx(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise FirescaleError(f"{directory} has no {stem} or {stem}.gz; an IDX source needs train-images-idx3-ubyte, "
                         "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte")


def load_idx_source(directory: Path) -> SourceData:
    """MNIST-style IDX files in `directory`, keeping their train/test split."""
    if not directory.is_dir():
        raise FirescaleError(f"IDX source directory {directory} does not exist")
    splits = {}
    num_classes = 0
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_find_idx(directory, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find_idx(directory, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise FirescaleError(f"{directory}: {prefix}-images must be uint8 (N, H, W), "
                                 f"got {images.dtype} {images.shape}")
        if labels.shape != (images.shape[0],):
            raise FirescaleError(f"{directory}: {prefix}-labels has {labels.shape[0]} labels "
                                 f"for {images.shape[0]} images")
        splits[split] = (images[:, :, :, None].copy(), labels)
        num_classes = max(num_classes, int(labels.max()) + 1 if len(labels) else 0)
    names_file = directory / "classes.txt"
    if names_file.is_file():
        classes = [ln.strip() for ln in names_file.read_text().splitlines() if ln.strip()]
    elif "fashion" in directory.resolve().name.lower() and num_classes <= 10:
        classes = FASHION_CLASSES
    else:
        classes = [str(i) for i in range(num_classes)]
    if len(classes) < num_classes:
        raise FirescaleError(f"{names_file} names {len(classes)} classes but the labels go up to {num_classes - 1}")
    return SourceData("idx", str(directory.resolve()), classes, splits, {"split": "the IDX files' own"})


def load_folder_source(directory: Path, test_fraction: float, seed: int,
                       resize: tuple[int, int] | None) -> SourceData:
    """An image folder with one subfolder per class."""
    from PIL import Image, UnidentifiedImageError

    if not directory.is_dir():
        raise FirescaleError(f"image folder {directory} does not exist")
    classes = sorted(p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise FirescaleError(f"image folder {directory} has no class subfolders")
    files: list[tuple[Path, int]] = []
    for label, cls in enumerate(classes):
        members = sorted(p for p in (directory / cls).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not members:
            raise FirescaleError(f"class folder {directory / cls} holds no .jpg/.jpeg/.png/.bmp/.gif files")
        files += [(p, label) for p in members]
    decoded = []
    for path, _ in files:
        try:
            with Image.open(path) as img:
                img.load()
                grey = img.mode in ("L", "1", "I;16", "I")
                rgb: Image.Image = img.convert("L" if grey else "RGB")
                if resize is not None:
                    rgb = rgb.resize((resize[1], resize[0]), Image.Resampling.BILINEAR)
                decoded.append((np.asarray(rgb, np.uint8), grey))
        except (UnidentifiedImageError, OSError) as exc:
            raise FirescaleError(f"{path} cannot be decoded as an image ({exc})") from exc
    all_grey = all(g for _, g in decoded)
    arrays = []
    for array, grey in decoded:
        if not all_grey and grey:
            array = np.repeat(array[:, :, None], 3, axis=2)
        arrays.append(array[:, :, None] if array.ndim == 2 else array)
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise FirescaleError(f"images under {directory} have different sizes {sorted(shapes)[:3]}...; "
                             f"pass --resize HxW")
    images = np.stack(arrays)
    labels = np.asarray([label for _, label in files], np.int64)
    train, test = stratified_split(labels, test_fraction, seed)
    return SourceData("folder", str(directory.resolve()), classes,
                      {"train": (images[train], labels[train]), "test": (images[test], labels[test])},
                      {"files": len(files), "test_fraction": test_fraction, "split_seed": seed,
                       "colour": "grey" if all_grey else "RGB"})


def resize_images(images: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize of uint8 (N, H, W, C) images to (N, size[0], size[1], C) with Pillow."""
    from PIL import Image

    if images.shape[1:3] == tuple(size):
        return images
    out = np.empty((images.shape[0], size[0], size[1], images.shape[3]), np.uint8)
    for i, image in enumerate(images):
        img = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)
        resized = np.asarray(img.resize((size[1], size[0]), Image.Resampling.BILINEAR), np.uint8)
        out[i] = resized[:, :, None] if resized.ndim == 2 else resized
    return out


def parse_resize(text: str | None) -> tuple[int, int] | None:
    """"HxW" as (H, W)."""
    if text is None:
        return None
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise FirescaleError(f"--resize must look like HxW (e.g. 32x32), got {text!r}") from None
    if h <= 0 or w <= 0:
        raise FirescaleError(f"--resize needs positive sizes, got {text!r}")
    return h, w


def load_source(spec: str, *, test_fraction: float, seed: int, resize: tuple[int, int] | None) -> SourceData:
    """Load `digits`, `idx:DIR` or `folder:DIR`, resized to `resize` if given."""
    kind, _, where = spec.partition(":")
    if kind == "digits" and not where:
        data = load_digits_source(test_fraction, seed)
    elif kind == "idx" and where:
        data = load_idx_source(Path(where))
    elif kind == "folder" and where:
        return load_folder_source(Path(where), test_fraction, seed, resize)
    else:
        raise FirescaleError(f"--source {spec!r} is not one of digits, idx:DIR, folder:DIR")
    if resize is not None:
        data.splits = {s: (resize_images(x, resize), y) for s, (x, y) in data.splits.items()}
    return data
