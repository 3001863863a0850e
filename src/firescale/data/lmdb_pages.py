"""Where each record of an LMDB lies in data.mdb, found with plain reads: the keys a short file lost.

LMDB maps data.mdb into memory, and touching a page past the end of a short file kills the process
with SIGBUS, so a truncated file cannot be explored through LMDB itself.  This module walks the main
B-tree of LMDB 0.9's on-disk format with ordinary reads instead and reports, for every record in key
order, the end of the bytes it needs (its leaf page, or its overflow pages for a large value).

    page header (16 bytes): pgno u64, pad u16, flags u16, lower u16, upper u16 (or overflow pages u32)
    meta pages 0 and 1: magic 0xBEEFC0DE, version, address, mapsize, two databases (free, main), last
        page, txnid; the one with the larger txnid is current; the free database's first field is the
        page size.  A database: pad u32, flags u16, depth u16, branch/leaf/overflow pages, entries, root.
    node: lo u16, hi u16, flags u16, key size u16, key, then data; in a branch page the child page
        number is lo | hi << 16 | flags << 32; in a leaf the data size is lo | hi << 16, and with
        F_BIGDATA the data is the u64 number of the first overflow page.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

PAGE_HEADER = 16
P_BRANCH, P_LEAF, P_LEAF2 = 0x01, 0x02, 0x20
F_BIGDATA = 0x01
MAGIC = 0xBEEFC0DE
NO_PAGE = 2**64 - 1


class LayoutError(ValueError):
    """data.mdb does not hold the LMDB layout this module reads."""


class TreePageError(LayoutError):
    """A branch or leaf page of the B-tree is damaged; `first_key` is the first key it should lead to."""

    def __init__(self, message: str, pgno: int, first_key: bytes) -> None:
        super().__init__(message)
        self.pgno = pgno
        self.first_key = first_key


@dataclass
class RecordSpan:
    """The record `key` needs data.mdb's bytes up to `end`; `subtree` marks a lost tree page.

    When a branch or leaf page itself lies past the end, every record under it is lost and only the
    first key of that subtree is known (from the parent page; empty for the first subtree).
    """

    key: bytes
    end: int
    subtree: bool = False


@dataclass
class LostRecords:
    """The records a short data.mdb cannot deliver."""

    first_key: bytes
    first_end: int
    count: int
    subtree: bool


def _meta(fd: int) -> tuple[int, int]:
    """(page size, root page of the main database) from the current meta page."""
    head = os.pread(fd, 152, 0)
    if len(head) < 152 or struct.unpack_from("<II", head, 16) != (MAGIC, 1):
        raise LayoutError("page 0 is not an LMDB 0.9 meta page")
    psize = struct.unpack_from("<I", head, 40)[0]
    if psize < 512 or psize & (psize - 1):
        raise LayoutError(f"meta page gives page size {psize}")
    best = None
    for page in (head, os.pread(fd, 152, psize)):
        if len(page) < 152 or struct.unpack_from("<I", page, 16)[0] != MAGIC:
            continue
        root, txnid = struct.unpack_from("<Q", page, 128)[0], struct.unpack_from("<Q", page, 144)[0]
        if best is None or txnid > best[1]:
            best = (root, txnid)
    if best is None:
        raise LayoutError("no valid meta page")
    return psize, best[0]


def record_spans(path: str | os.PathLike[str]) -> Iterator[RecordSpan]:
    """Every record of the main database in key order, with the end of the bytes it needs."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        psize, root = _meta(fd)
        if root != NO_PAGE:
            yield from _visit(fd, size, psize, root, b"", 0)
    finally:
        os.close(fd)


def _visit(fd: int, size: int, psize: int, pgno: int, first_key: bytes, depth: int) -> Iterator[RecordSpan]:
    if depth > 64:
        raise TreePageError("the B-tree is deeper than 64 levels", pgno, first_key)
    offset = pgno * psize
    if offset + psize > size:
        yield RecordSpan(first_key, offset + psize, subtree=True)
        return
    page = os.pread(fd, psize, offset)
    flags, lower = struct.unpack_from("<HH", page, 10)
    count = (lower - PAGE_HEADER) >> 1
    if lower < PAGE_HEADER or lower > psize or flags & P_LEAF2 or not flags & (P_BRANCH | P_LEAF):
        raise TreePageError(f"tree page {pgno} is neither a branch nor a leaf page (flags {flags:#x})", pgno, first_key)
    for i, ptr in enumerate(struct.unpack_from(f"<{count}H", page, PAGE_HEADER)):
        if ptr + 8 > psize:
            raise TreePageError(f"tree page {pgno} has node {i} starting past the page", pgno, first_key)
        lo, hi, node_flags, ksize = struct.unpack_from("<4H", page, ptr)
        key = page[ptr + 8:ptr + 8 + ksize]
        if flags & P_BRANCH:
            child = lo | hi << 16 | node_flags << 32
            yield from _visit(fd, size, psize, child, key if i else first_key, depth + 1)
        elif node_flags & F_BIGDATA:
            first = struct.unpack_from("<Q", page, ptr + 8 + ksize)[0]
            yield RecordSpan(key, first * psize + PAGE_HEADER + (lo | hi << 16))
        else:
            yield RecordSpan(key, offset + psize)


def lost_records(path: str | os.PathLike[str]) -> LostRecords | None:
    """The records of data.mdb at `path` that need bytes past its end, or None if every one is whole."""
    size = Path(path).stat().st_size
    first: RecordSpan | None = None
    count = 0
    for span in record_spans(path):
        if span.end > size:
            first = first or span
            count += 1
    if first is None:
        return None
    return LostRecords(first.key, first.end, count, first.subtree)


@dataclass
class ValueIndex:
    """Where each record's value lies in data.mdb, in key order: `keys`, and int64 `offsets`, `lengths`."""

    keys: list[bytes]
    offsets: np.ndarray
    lengths: np.ndarray


def value_index(path: str | os.PathLike[str]) -> ValueIndex:
    """The file offset and length of every value of the main database, from one walk with plain reads.

    Only the main database of plain records is indexed: a page outside the file, a damaged page, or
    duplicate-sorted or sub-database nodes raise LayoutError (the caller then reads through LMDB).
    """
    import numpy as np

    fd = os.open(path, os.O_RDONLY)
    keys: list[bytes] = []
    offsets: list[int] = []
    lengths: list[int] = []
    try:
        size = os.fstat(fd).st_size
        psize, root = _meta(fd)
        stack = [] if root == NO_PAGE else [(root, 0)]
        while stack:
            pgno, depth = stack.pop()
            offset = pgno * psize
            if depth > 64 or offset + psize > size:
                raise LayoutError(f"tree page {pgno} is too deep or lies past the end")
            page = os.pread(fd, psize, offset)
            flags, lower = struct.unpack_from("<HH", page, 10)
            count = (lower - PAGE_HEADER) >> 1
            if lower < PAGE_HEADER or lower > psize or flags & P_LEAF2 or not flags & (P_BRANCH | P_LEAF):
                raise LayoutError(f"tree page {pgno} is neither a branch nor a leaf page (flags {flags:#x})")
            ptrs = struct.unpack_from(f"<{count}H", page, PAGE_HEADER)
            if flags & P_BRANCH:
                children = []
                for ptr in ptrs:
                    lo, hi, node_flags = struct.unpack_from("<3H", page, ptr)
                    children.append((lo | hi << 16 | node_flags << 32, depth + 1))
                stack.extend(reversed(children))  # popped in key order
                continue
            for ptr in ptrs:
                if ptr + 8 > psize:
                    raise LayoutError(f"tree page {pgno} has a node starting past the page")
                lo, hi, node_flags, ksize = struct.unpack_from("<4H", page, ptr)
                keys.append(page[ptr + 8:ptr + 8 + ksize])
                lengths.append(lo | hi << 16)
                if node_flags == F_BIGDATA:
                    offsets.append(struct.unpack_from("<Q", page, ptr + 8 + ksize)[0] * psize + PAGE_HEADER)
                elif node_flags == 0:
                    offsets.append(offset + ptr + 8 + ksize)
                else:
                    raise LayoutError(f"tree page {pgno} holds a node with flags {node_flags:#x}")
    finally:
        os.close(fd)
    return ValueIndex(keys, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64))
