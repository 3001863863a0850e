"""A finished dataset file mapped read-only, and the size check every batch makes before copying from it.

Readers copy records straight out of the map.  Touching a mapped page past the end of a file that
shrank would end the process with SIGBUS, so before each batch `short_record` compares the file's
current size (and the mapped length) with the end of every record the batch needs.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np


class MappedFile:
    """`path` opened and mapped read-only once; `bytes` is a uint8 view of the map (empty for an empty file)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.fd: int | None = os.open(self.path, os.O_RDONLY)
        size = os.fstat(self.fd).st_size
        self.map: mmap.mmap | None = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ) if size else None
        self.bytes: np.ndarray | None = (np.frombuffer(self.map, np.uint8) if self.map is not None
                                         else np.empty(0, np.uint8))

    def short_record(self, offsets: np.ndarray, ends: np.ndarray) -> tuple[int, str] | None:
        """(position, why) of the first record (in file order) whose bytes the file no longer holds, or None."""
        if self.fd is None or self.bytes is None:
            raise ValueError(f"{self.path} was closed before its records were checked")
        have = os.fstat(self.fd).st_size
        mapped = len(self.bytes)
        limit = min(have, mapped)
        if not len(ends) or int(ends.max()) <= limit:
            return None
        past = np.nonzero(ends > limit)[0]
        j = int(past[np.argmin(offsets[past])])
        why = (f"the file has {have} bytes; it is truncated" if have < int(ends[j]) else
               f"the file had {mapped} bytes when opened; it has changed since")
        return j, why

    def close(self) -> None:
        """Unmap and close; views of `bytes` the caller made must be dropped first."""
        self.bytes = None
        if self.map is not None:
            self.map.close()
            self.map = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
