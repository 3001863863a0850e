"""What h5py raises for an HDF5 file whose bytes are damaged, and the one sentence that names the file and the
part that cannot be read: one table for every reader of HDF5 (datasets, weights, solver states)."""
from __future__ import annotations

from pathlib import Path

from firescale.errors import FirescaleError

# OSError and RuntimeError from the HDF5 library (a checksum, a signature, an address past the end of the file),
# KeyError for an object whose header cannot be read, ValueError and TypeError for a damaged datatype, dataspace
# or link name, MemoryError for a dataspace whose size is damaged.
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, MemoryError)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (HDF5's errors go on for lines), or its type's name."""
    text = str(exc).strip().strip("'\"")
    return text.splitlines()[0] if text else type(exc).__name__


def damaged(path: str | Path, what: str, exc: BaseException) -> FirescaleError:
    """The error for a part of an HDF5 file that h5py cannot read, in one sentence naming file and part."""
    return FirescaleError(f"{path} {what} cannot be read: HDF5 reports {first_line(exc)}; the file is damaged")
