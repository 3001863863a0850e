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
NODE_HEADER = 8
META_BYTES = 152
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2, P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
PAGE_TYPES = P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2 | P_SUBP
F_BIGDATA = 0x01
MAGIC = 0xBEEFC0DE
NO_PAGE = 2**64 - 1
MAX_DEPTH = 32  # LMDB's cursor stack (CURSOR_STACK): a deeper tree cannot be read


class LayoutError(ValueError):
    """data.mdb does not hold the LMDB layout this module reads."""


class TruncatedError(LayoutError):
    """data.mdb is shorter than the pages its meta page says are in use."""

    def __init__(self, message: str, size: int, needed: int) -> None:
        super().__init__(message)
        self.size = size
        self.needed = needed


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


@dataclass
class Meta:
    """What LMDB takes from the newer meta page: page size, the main database, the last page in use."""

    psize: int
    root: int
    depth: int
    flags: int
    entries: int
    last_pgno: int

    @property
    def bytes_needed(self) -> int:
        return (self.last_pgno + 1) * self.psize


def read_meta(fd: int) -> Meta:
    """The meta page LMDB will use, after the checks LMDB makes of both before it maps the file (and a few more).

    LMDB reads both meta pages with plain reads, refuses the file unless both are meta pages of its
    version, and then takes the one with the larger transaction id (page 0 on a tie).
    """
    metas = []
    psize = 0
    for number in (0, 1):
        page = os.pread(fd, META_BYTES, number * psize)
        if len(page) < META_BYTES:
            raise LayoutError(f"the file ends inside meta page {number}")
        flags = struct.unpack_from("<H", page, 10)[0]
        magic, version = struct.unpack_from("<II", page, 16)
        if not flags & P_META or magic != MAGIC or version != 1:
            raise LayoutError(f"page {number} is not an LMDB 0.9 meta page")
        size = struct.unpack_from("<I", page, 40)[0]
        if number == 0:
            if size < 512 or size > 65536 or size & (size - 1):
                raise LayoutError(f"meta page 0 gives page size {size}, not a power of two from 512 to 65536")
            psize = size
        elif size != psize:
            raise LayoutError(f"meta page 1 gives page size {size}, meta page 0 {psize}")
        db_flags, depth = struct.unpack_from("<HH", page, 92)
        entries, root, last_pgno, txnid = struct.unpack_from("<4Q", page, 120)
        metas.append((txnid, Meta(psize, root, depth, db_flags, entries, last_pgno)))
    meta = metas[1][1] if metas[1][0] > metas[0][0] else metas[0][1]
    if meta.flags:
        raise LayoutError(f"the main database has flags {meta.flags:#x}; a dataset's LMDB holds plain records "
                          "(no duplicate, integer or reversed keys)")
    if meta.last_pgno < 1 or meta.last_pgno >= 1 << 48:
        raise LayoutError(f"the meta page gives {meta.last_pgno} as the last page")
    if meta.root == NO_PAGE:
        if meta.entries:
            raise LayoutError(f"the meta page counts {meta.entries} records in an empty tree")
    elif not 2 <= meta.root <= meta.last_pgno:
        raise LayoutError(f"the meta page gives root page {meta.root}; allowed are pages 2..{meta.last_pgno}")
    return meta


def _page_error(pgno: int, low: bytes, problem: str) -> TreePageError:
    return TreePageError(f"tree page {pgno} {problem}", pgno, low)


def _check_page(page: bytes, pgno: int, low: bytes, psize: int) -> tuple[bool, tuple[int, ...]]:
    """(leaf or not, the node offsets) of a tree page, after checking its header as LMDB's cursors rely on it."""
    number, _, flags, lower, upper = struct.unpack_from("<QHHHH", page, 0)
    if number != pgno:
        raise _page_error(pgno, low, f"says it is page {number}")
    if flags & PAGE_TYPES not in (P_BRANCH, P_LEAF):
        raise _page_error(pgno, low, f"has flags {flags:#x}, neither a branch nor a leaf page's")
    leaf = flags & PAGE_TYPES == P_LEAF
    count = (lower - PAGE_HEADER) >> 1
    least = 1 if leaf else 2
    if lower < PAGE_HEADER or lower & 1 or upper < lower or upper > psize or count < least:
        kind = "leaf" if leaf else "branch"
        raise _page_error(pgno, low, f"has a header giving {count} nodes, free bytes {lower}..{upper}; a "
                                     f"{kind} page holds {least} or more inside its {psize} bytes")
    ptrs = struct.unpack_from(f"<{count}H", page, PAGE_HEADER)
    for i, ptr in enumerate(ptrs):
        if ptr < upper or ptr & 1 or ptr + NODE_HEADER > psize:
            raise _page_error(pgno, low, f"has node {i} at offset {ptr}, outside its nodes {upper}..{psize}")
    return leaf, ptrs


class _Walk:
    """One walk of the main B-tree in key order, keeping what the value index needs."""

    def __init__(self, fd: int, meta: Meta) -> None:
        self.fd = fd
        self.meta = meta
        self.seen: set[int] = set()
        self.leaf_level: int | None = None
        self.keys: list[bytes] = []
        self.offsets: list[int] = []
        self.lengths: list[int] = []

    def page(self, pgno: int, low: bytes) -> bytes:
        if not 2 <= pgno <= self.meta.last_pgno:
            raise _page_error(pgno, low, f"is named by its parent but lies outside pages 2..{self.meta.last_pgno}")
        if pgno in self.seen:
            raise _page_error(pgno, low, "is named twice in the tree")
        self.seen.add(pgno)
        return os.pread(self.fd, self.meta.psize, pgno * self.meta.psize)

    def visit(self, pgno: int, low: bytes, high: bytes | None, level: int) -> None:
        """Check the page `pgno`, `level` pages below the root, holding the keys from `low` up to `high`."""
        if level > MAX_DEPTH:
            raise _page_error(pgno, low, f"lies {level} levels deep; LMDB reads trees of {MAX_DEPTH} at most")
        page = self.page(pgno, low)
        leaf, ptrs = _check_page(page, pgno, low, self.meta.psize)
        if self.leaf_level is None and leaf:
            self.leaf_level = level
        if (self.leaf_level is not None and level >= self.leaf_level) != leaf or (
                leaf and level != self.leaf_level):
            kind = "a leaf" if leaf else "a branch"
            raise _page_error(pgno, low, f"is {kind} page at level {level}, but the tree's leaves are at level "
                                         f"{self.leaf_level}")
        if leaf:
            self.leaf(page, pgno, ptrs, low, high)
        else:
            self.branch(page, pgno, ptrs, low, high, level)

    def branch(self, page: bytes, pgno: int, ptrs: tuple[int, ...], low: bytes, high: bytes | None,
               level: int) -> None:
        """Walk a branch page's children in key order, each with the key range it covers."""
        children: list[tuple[int, bytes]] = []
        for i, ptr in enumerate(ptrs):
            lo, hi, top, ksize = struct.unpack_from("<4H", page, ptr)
            if ptr + NODE_HEADER + ksize > self.meta.psize:
                raise _page_error(pgno, low, f"has node {i} whose key runs past the page")
            key = page[ptr + NODE_HEADER:ptr + NODE_HEADER + ksize] if i else low
            if i and (key <= children[-1][1] or key < low or (high is not None and key >= high)):
                raise _page_error(pgno, low, f"holds key {show_key(key)} out of order")
            children.append((lo | hi << 16 | top << 32, key))
        for i, (child, key) in enumerate(children):
            self.visit(child, key, children[i + 1][1] if i + 1 < len(children) else high, level + 1)

    def leaf(self, page: bytes, pgno: int, ptrs: tuple[int, ...], low: bytes, high: bytes | None) -> None:
        """Check a leaf page's records and their values (in the page or on overflow pages); index them."""
        psize, last = self.meta.psize, self.meta.last_pgno
        offset = pgno * psize
        for i, ptr in enumerate(ptrs):
            lo, hi, node_flags, ksize = struct.unpack_from("<4H", page, ptr)
            start = ptr + NODE_HEADER + ksize
            key = page[ptr + NODE_HEADER:start]
            size = lo | hi << 16
            previous = self.keys[-1] if self.keys else None
            if start > psize or (previous is not None and key <= previous) or key < low or (
                    high is not None and key >= high):
                raise _page_error(pgno, low, f"holds node {i} with a key out of order or past the page")
            if node_flags == F_BIGDATA:
                if start + 8 > psize:
                    raise _page_error(pgno, low, f"has record {show_key(key)} whose overflow page number runs past "
                                                 "the page")
                first = struct.unpack_from("<Q", page, start)[0]
                pages = -(-(PAGE_HEADER + size) // psize)
                if first < 2 or first + pages - 1 > last:
                    raise _page_error(pgno, low, f"has record {show_key(key)} on overflow pages {first}.."
                                                 f"{first + pages - 1}, outside pages 2..{last}")
                self.offsets.append(first * psize + PAGE_HEADER)
            elif node_flags == 0:
                if start + size > psize:
                    raise _page_error(pgno, low, f"has record {show_key(key)} of {size} bytes running past the page")
                self.offsets.append(offset + start)
            else:
                raise _page_error(pgno, low, f"has record {show_key(key)} with node flags {node_flags:#x} (a record's "
                                             "are 0, or 0x1 on overflow pages)")
            self.keys.append(key)
            self.lengths.append(size)


KEY_SHOWN = 40  # characters of a key an error shows: a damaged key can hold a page of bytes


def show_key(key: bytes) -> str:
    """A record's key as an error shows it: UTF-8, unprintable characters escaped, at most KEY_SHOWN of them."""
    text = key.decode(errors="replace")
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:KEY_SHOWN])
    return shown + ("..." if len(text) > KEY_SHOWN else "")



def value_index(path: str | os.PathLike[str]) -> ValueIndex:
    """The file offset and length of every value of the main database, from one walk with plain reads.

    The walk checks every page LMDB's lookups and cursors would touch, before LMDB maps the file:
    the meta pages as LMDB reads them; that the file holds every page up to the last one in use
    (else LayoutError; lost_records then says what is missing); and each branch and leaf page in
    turn: its number, type, header and node offsets, keys in order within the range its parent gives,
    every leaf at the same depth, no page named twice, values inside their page or on overflow pages
    in use, and as many records as the meta page counts.  A damaged page raises TreePageError naming
    the first key of the records below it; anything else that is not a dataset's LMDB, LayoutError.
    """
    import numpy as np

    fd = os.open(path, os.O_RDONLY)
    try:
        meta = read_meta(fd)
        size = os.fstat(fd).st_size
        if size < meta.bytes_needed:
            raise TruncatedError(f"the file has {size} bytes but its pages need {meta.bytes_needed}",
                                 size, meta.bytes_needed)
        walk = _Walk(fd, meta)
        if meta.root != NO_PAGE:
            walk.visit(meta.root, b"", None, 1)
    finally:
        os.close(fd)
    if len(walk.keys) != meta.entries:
        raise TreePageError(f"the tree holds {len(walk.keys)} records but the meta page counts {meta.entries}",
                            meta.root, b"")
    return ValueIndex(walk.keys, np.asarray(walk.offsets, np.int64), np.asarray(walk.lengths, np.int64))
