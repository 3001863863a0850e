"""Mutations of real files, made three ways: bytes changed where the format keeps its structure
(`mutated_bytes` aimed at the offsets of protobuf fields, LMDB pages and nodes or HDF5's signed structures),
tokens of a text file changed (`mutated_text`), and the parsed file's tree changed and written back
(`mutated_tree`, `prototxt`), so that a mutation gets past the parser to the checks behind it."""
from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

from hypothesis import strategies as st

# ---------------------------------------------------------------- bytes

# Values a damaged or hostile file holds where a count, a length or a size belongs.
INTERESTING_INTS = (0, 1, 2, 3, 7, 8, 15, 16, 127, 128, 255, 256, 4095, 4096, 4097, 65535, 65536, 2**31 - 1, 2**31,
                    2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)


def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


class Mutated:
    """Bytes made by mutating a file, shown by the changes made (`ops`) rather than by every byte: a failing
    example prints short, and `replay(base, ops)` makes the bytes again for a regression test."""

    def __init__(self, data: bytes, ops: list[tuple], size: int) -> None:
        self.data, self.ops, self.size = data, ops, size

    def __repr__(self) -> str:
        return f"Mutated(ops={self.ops!r}) of a {self.size}-byte file, {len(self.data)} bytes"


def _change(raw: bytearray, op: str, at: int, arg: Any) -> None:
    """One change to `raw` in place (what `mutated_bytes` draws, and `replay` repeats)."""
    if op == "flip" and at < len(raw):
        raw[at] ^= 1 << arg
    elif op == "set" and at < len(raw):
        raw[at] = arg
    elif op == "int":
        value, size = arg
        raw[at:at + size] = (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")
    elif op == "varint":
        value, replaced = arg
        raw[at:at + replaced] = varint(value)
    elif op == "insert":
        raw[at:at] = arg
    elif op == "delete":
        del raw[at:at + arg]
    elif op == "copy":
        src, n = arg
        raw[at:at] = raw[src:src + n]
    elif op == "zero":
        raw[at:at + arg] = bytes(len(raw[at:at + arg]))
    elif op == "cut":
        del raw[at:]


def replay(base: bytes, ops: Sequence[tuple]) -> bytes:
    """The bytes a `Mutated` of `base` holds, from its ops."""
    raw = bytearray(base)
    for op, at, arg in ops:
        _change(raw, op, at, arg)
    return bytes(raw)


@st.composite
def mutated_bytes(draw, base: bytes, hot: Sequence[int] = (), max_ops: int = 4) -> Mutated:
    """`base` with 1 to `max_ops` changes: bytes flipped or set, an integer written (little-endian or as a
    varint), bytes inserted, a span deleted, copied or zeroed, or the file cut short.  Half the positions are
    drawn from `hot` (where the format's structure lies), the rest anywhere."""
    raw = bytearray(base)
    ops: list[tuple] = []

    def where() -> int:
        if not raw:
            return 0
        if hot and draw(st.booleans()):
            return min(draw(st.sampled_from(hot)) + draw(st.integers(0, 7)), len(raw) - 1)
        return draw(st.integers(0, len(raw) - 1))

    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(("flip", "set", "int", "varint", "insert", "delete", "copy", "zero", "cut")))
        at = where()
        arg: Any = None
        if op == "flip":
            arg = draw(st.integers(0, 7))
        elif op == "set":
            arg = draw(st.sampled_from((0, 1, 0x7F, 0x80, 0xFF))) if draw(st.booleans()) else draw(st.integers(0, 255))
        elif op == "int":
            arg = (draw(st.sampled_from(INTERESTING_INTS)), draw(st.sampled_from((1, 2, 4, 8))))
        elif op == "varint":
            arg = (draw(st.sampled_from(INTERESTING_INTS)), draw(st.integers(0, 3)))
        elif op == "insert":
            arg = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            arg = draw(st.integers(1, 64))
        elif op == "copy":
            arg = (where(), draw(st.integers(1, 256)))
        elif op == "zero":
            arg = draw(st.integers(1, 4096))
        ops.append((op, at, arg))
        _change(raw, op, at, arg)
    return Mutated(bytes(raw), ops, len(base))


def any_bytes(base: bytes, hot: Sequence[int] = ()) -> st.SearchStrategy[Mutated]:
    """Mostly mutations of `base`; now and then bytes of no format at all, or nothing."""
    noise = st.binary(max_size=256).map(lambda b: Mutated(b, [("bytes", 0, b)], len(base)))
    return st.one_of(mutated_bytes(base, hot), mutated_bytes(base, hot), mutated_bytes(base, hot), noise)


def protobuf_offsets(buf: bytes, start: int = 0, depth: int = 0) -> list[int]:
    """Where the fields of a protobuf message start (their keys, lengths and values), nested messages' too: the
    offsets a mutation of a .caffemodel or .solverstate hits to reach its structure rather than its floats.  A
    payload is taken for a message when it parses whole with field numbers Caffe uses (under 200)."""
    fields = _fields(buf)
    if fields is None:
        return []
    found: list[int] = []
    for at, payload in fields:
        found.append(start + at)
        if payload is not None and depth < 4:
            found += protobuf_offsets(buf[payload[0]:payload[1]], start + payload[0], depth + 1)
    return found


def _fields(buf: bytes) -> list[tuple[int, tuple[int, int] | None]] | None:
    """(offset, span of a length-delimited payload) of each field, or None when `buf` is not a whole message."""
    from firescale.caffe.wire import FIXED32, FIXED64, LENGTH_DELIMITED, VARINT, WireError, decode_varint

    out: list[tuple[int, tuple[int, int] | None]] = []
    pos, end = 0, len(buf)
    try:
        while pos < end:
            at = pos
            key, pos = decode_varint(buf, pos)
            number, wire_type = key >> 3, key & 7
            if not 0 < number < 200:
                return None
            span = None
            if wire_type == VARINT:
                pos = decode_varint(buf, pos)[1]
            elif wire_type == LENGTH_DELIMITED:
                length, pos = decode_varint(buf, pos)
                span = (pos, pos + length)
                pos += length
            elif wire_type in (FIXED32, FIXED64):
                pos += 4 if wire_type == FIXED32 else 8
            else:
                return None
            if pos > end:
                return None
            out.append((at, span))
    except WireError:
        return None
    return out


# ---------------------------------------------------------------- text

_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_./-]*|[-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?'
                    r'|[ \t]+|\n|.', re.S)
INTERESTING_NUMBERS = ("0", "-1", "1", "2", "-0", "0.0", "1.5", "-2147483648", "2147483647", "2147483648",
                       "4294967296", "9223372036854775808", "-9223372036854775809", "99999999999999999999999999",
                       "1e309", "-1e309", "1e-320", "nan", "inf", "-inf", "NaN", ".inf", "0x10", "0o17", "1_000",
                       "3.4028235e38", "1e9", "65536")
PUNCTUATION = tuple('{}[]:;,<>"\'#\\\n\t') + ("- ", ": ", "  ", "&a ", "*a", "!!str ", "---\n", "...\n", "%", "|")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


@st.composite
def mutated_text(draw, base: str, words: Sequence[str] = (), max_ops: int = 4) -> str:
    """`base` with 1 to `max_ops` changes to its tokens: a number made an interesting one, a token deleted,
    doubled or replaced by another of the file's (or of `words`), punctuation inserted, a line doubled,
    dropped or moved, other text inserted, or the text cut short."""
    toks = tokens(base)
    vocabulary = sorted({t for t in toks if t.strip()} | set(words)) or ["x"]
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(("number", "delete", "double", "replace", "punct", "line", "insert", "cut")))
        at = draw(st.integers(0, max(0, len(toks) - 1)))
        if op == "number":
            numbers = [i for i, t in enumerate(toks) if re.fullmatch(r"[-+]?[\d.]+(?:[eE][-+]?\d+)?", t)]
            if numbers:
                toks[draw(st.sampled_from(numbers))] = draw(st.sampled_from(INTERESTING_NUMBERS))
        elif op == "delete" and toks:
            del toks[at]
        elif op == "double" and toks:
            toks.insert(at, toks[at])
        elif op == "replace" and toks:
            toks[at] = draw(st.sampled_from(vocabulary))
        elif op == "punct":
            toks.insert(at, draw(st.sampled_from(PUNCTUATION)))
        elif op == "line":
            lines = "".join(toks).split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            how = draw(st.sampled_from(("double", "drop", "move")))
            if how == "double":
                lines.insert(j, lines[i])
            elif how == "drop":
                del lines[i]
            else:
                lines.insert(j, lines.pop(i))
            toks = tokens("\n".join(lines))
        elif op == "insert":
            toks.insert(at, draw(st.text(min_size=1, max_size=8)))
        elif op == "cut":
            del toks[at:]
    return "".join(toks)


# ---------------------------------------------------------------- trees (parsed files)

def wild_values(words: Sequence[str] = ()) -> st.SearchStrategy[Any]:
    """What a user may write where a value belongs: every kind, the edge of every range."""
    scalars = st.one_of(
        st.none(), st.booleans(), st.sampled_from(INTERESTING_INTS), st.sampled_from([-x for x in INTERESTING_INTS]),
        st.integers(-10, 300), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
        st.sampled_from(list(words) or ["x"]))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.sampled_from(list(words) or ["x"]),
                                                                         inner, max_size=3)), max_leaves=6)


def _paths(tree: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _paths(v, (*prefix, i))


def _get(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree


@st.composite
def mutated_tree(draw, tree: Any, words: Sequence[str] = (), values: st.SearchStrategy[Any] | None = None,
                 max_ops: int = 3) -> Any:
    """A copy of the parsed file `tree` (dicts, lists, scalars) with 1 to `max_ops` changes at nodes drawn
    anywhere in it: a value replaced by a wild one (or by another node of the tree), a key dropped, a key of
    `words` added, a list's item doubled or dropped."""
    import copy

    tree = copy.deepcopy(tree)
    values = values if values is not None else wild_values(words)
    for _ in range(draw(st.integers(1, max_ops))):
        paths = list(_paths(tree))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(("value", "value", "other", "drop", "add", "double")))
        if not path:
            if op == "add" and isinstance(tree, dict):
                tree[draw(st.sampled_from(list(words) or ["x"]))] = draw(values)
            continue
        parent, key = _get(tree, path[:-1]), path[-1]
        if op == "value":
            parent[key] = draw(values)
        elif op == "other":
            parent[key] = copy.deepcopy(_get(tree, draw(st.sampled_from(paths))))
        elif op == "drop":
            del parent[key]
        elif op == "add" and isinstance(parent[key], dict):
            parent[key][draw(st.sampled_from(list(words) or ["x"]))] = draw(values)
        elif op == "double" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
    return tree


def tree_words(tree: Any) -> list[str]:
    """The keys and string values of a parsed file: the vocabulary its mutations draw new keys and values from."""
    found: set[str] = set()
    for path in _paths(tree):
        found.update(p for p in path if isinstance(p, str))
        node = _get(tree, path)
        if isinstance(node, str) and len(node) < 40:
            found.add(node)
    return sorted(found)


_ENUM = re.compile(r"[A-Z][A-Z0-9_]*")


def prototxt(tree: dict[str, Any], indent: str = "") -> str:
    """A mapping as Caffe's text format (firescale.caffe.prototxt reads it back): lists as repeated fields,
    mappings as blocks, upper-case words as enums, other strings quoted."""
    lines = []
    for key, value in tree.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                lines.append(f"{indent}{key} {{\n{prototxt(item, indent + '  ')}{indent}}}\n")
            else:
                lines.append(f"{indent}{key}: {_scalar(item)}\n")
    return "".join(lines)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    text = str(value)
    if _ENUM.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def lmdb_offsets(raw: bytes, page: int = 4096) -> list[int]:
    """Where LMDB keeps its structure in data.mdb: the meta pages' fields, every page's header, and the node
    pointers and node headers of its branch and leaf pages (firescale.data.lmdb_pages has the layout)."""
    import struct

    found = [m * page + f for m in (0, 1) for f in range(16, 16 + 152, 8)]
    for start in range(2 * page, len(raw) - page + 1, page):
        found += [start + 8, start + 10, start + 12, start + 14]
        flags, lower = struct.unpack_from("<HH", raw, start + 10)
        if flags & 0x03 and 16 <= lower <= page:
            for k in range((lower - 16) // 2):
                found.append(start + 16 + 2 * k)
                node = struct.unpack_from("<H", raw, start + 16 + 2 * k)[0]
                if node < page - 8:
                    found += [start + node, start + node + 4, start + node + 6]
    return found


HDF5_SIGNATURES = (b"TREE", b"HEAP", b"SNOD", b"OHDR", b"OCHK", b"BTHD", b"BTIN", b"BTLF", b"FRHP", b"FHDB",
                   b"FHIB", b"FSHD", b"FSSE", b"GCOL", b"EAHD", b"EAIB", b"EADB", b"FAHD", b"FADB")


def hdf5_offsets(raw: bytes) -> list[int]:
    """Where HDF5 keeps its structure: the superblock and the first KiB, and every signed structure (object
    headers, B-trees, heaps, symbol-table nodes) with the bytes after its signature."""
    found = list(range(0, 1024, 4))
    for signature in HDF5_SIGNATURES:
        at = raw.find(signature)
        while at >= 0 and len(found) < 20_000:
            found += range(at, at + 48, 4)
            at = raw.find(signature, at + 1)
    return found
