"""Caffe's protobuf text format (solvers, net files, layer-to-device plans): scalars, repeats, nested messages."""
from __future__ import annotations

import re
from typing import Any

from firescale.errors import FirescaleError

_TOKEN = re.compile(r'\s*(?:(#[^\n]*)'                                 # a comment
                    r'|("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')'         # a quoted string
                    r'|([{}<>:;,\[\]])'                                # punctuation
                    r'|([^\s{}<>:;,\[\]#"\']+))')                      # a bare word
_CLOSE = {"{": "}", "<": ">"}
# SolverParameter's repeated scalar fields; every other scalar field may be given once.
# `dist` (a layer-to-device plan, firescale.nets.device_plan) is given once for training and once for testing.
PLAN_KEY = "dist"
REPEATED = frozenset({"stepvalue", "test_iter", "test_net", "test_net_param", "test_state", "weights", PLAN_KEY})
# NetParameter's repeated top-level fields (a net file: firescale.caffe.net).
NET_REPEATED = frozenset({"layer", "layers", "input", "input_shape", "input_dim"})


_SIMPLE_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, "?": 63, "'": 39, '"': 34}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.DOTALL)


def unescape(body: str, source: str) -> str:
    """A quoted string's text as protobuf's text parser (Caffe's) reads it: the file's UTF-8 text with C's
    escapes, where an octal (\\303) or hex (\\xc3) escape is one byte and \\u/\\U a code point, the bytes then
    read as UTF-8."""
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(body):
        out += body[pos:m.start()].encode("utf-8")
        octal, hexa, short, long, other = m.groups()
        if octal is not None or hexa is not None:
            out.append(int(octal, 8) & 0xFF if octal is not None else int(hexa, 16))
        elif short is not None or long is not None:
            point = int(short or long, 16)
            if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
                raise FirescaleError(f"{source}: the escape {m.group(0)!r} in \"{body}\" is not a Unicode code point")
            out += chr(point).encode("utf-8")
        elif other in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[other])
        else:
            raise FirescaleError(f"{source}: {m.group(0)!r} in \"{body}\" is not an escape Caffe's text format "
                                 "knows; use \\n, \\t, \\\\, \\\", an octal \\ooo or a hex \\xhh")
        pos = m.end()
    out += body[pos:].encode("utf-8")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise FirescaleError(f"{source}: the string \"{body}\" is not UTF-8 once its escapes are read") from None


def tokenize(text: str, source: str) -> list[tuple[str, str]]:
    """(kind, text) pairs: 'str' for a quoted string (escapes decoded), 'punct', or 'word'."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise FirescaleError(f"{source}: cannot read Caffe's text format near {text[pos:pos + 30]!r}")
        pos = m.end()
        comment, quoted, punct, word = m.groups()
        if quoted is not None:
            text_of = unescape(quoted[1:-1], source)
            if tokens and tokens[-1][0] == "str":   # "a" "b" is "ab", as in C and protobuf's text format
                tokens[-1] = ("str", tokens[-1][1] + text_of)
            else:
                tokens.append(("str", text_of))
        elif punct is not None:
            tokens.append(("punct", punct))
        elif word is not None:
            tokens.append(("word", word))
    return tokens


def scalar(word: str) -> Any:
    """An unquoted value: an integer, a float, true/false, or an enum name such as GPU or SGD."""
    if re.fullmatch(r"[+-]?\d+", word):
        return int(word)
    try:
        return float(word)
    except ValueError:
        pass
    if word in ("true", "false", "True", "False"):
        return word.lower() == "true"
    return word


class _Reader:
    def __init__(self, tokens: list[tuple[str, str]], source: str, repeated: frozenset[str] = REPEATED,
                 what: str = "solver") -> None:
        self.tokens, self.source, self.i = tokens, source, 0
        self.repeated, self.what = repeated, what

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise FirescaleError(f"{self.source}: the {self.what} prototxt ends in the middle of a field")
        self.i += 1
        return token

    def message(self, close: str | None, top: bool) -> dict[str, Any]:
        """Fields up to `close` (or the end); a nested message's fields are kept as a dict."""
        out: dict[str, Any] = {}
        while (token := self.peek()) is not None and token != ("punct", close):
            kind, key = self.take()
            if kind != "word":
                raise FirescaleError(f"{self.source}: expected a {self.what} key, found {key!r}")
            value = self.value(key)
            if self.peek() in (("punct", ";"), ("punct", ",")):
                self.take()
            if top and key in self.repeated:
                out.setdefault(key, []).extend(value if isinstance(value, list) else [value])
            elif key not in out:
                out[key] = value
            elif top:
                raise FirescaleError(f"{self.source}: {self.what} key {key!r} is given twice")
            else:  # inside a net or state message: a repeated field such as `layer` or `stage`
                out[key] = (out[key] if isinstance(out[key], list) else [out[key]]) + [value]
        if close is not None:
            if self.peek() is None:
                raise FirescaleError(f"{self.source}: a block is not closed with {close!r}")
            self.take()
        return out

    def value(self, key: str) -> Any:
        token = self.peek()
        if token == ("punct", ":"):
            self.take()
            token = self.peek()
        if token is not None and token[0] == "punct" and token[1] in _CLOSE:
            self.take()
            return self.message(_CLOSE[token[1]], top=False)
        if token == ("punct", "["):
            self.take()
            items = []
            while self.peek() != ("punct", "]"):
                kind, raw = self.take()
                if kind == "punct" and raw != ",":
                    raise FirescaleError(f"{self.source}: {self.what} key {key!r} has a bad list near {raw!r}")
                if kind != "punct":
                    items.append(raw if kind == "str" else scalar(raw))
            self.take()
            return items
        if token is None or token[0] == "punct":
            raise FirescaleError(f"{self.source}: {self.what} key {key!r} has no value (expected 'key: value')")
        kind, raw = self.take()
        return raw if kind == "str" else scalar(raw)


def parse_prototxt(text: str, source: str, *, net: bool = False) -> dict[str, Any]:
    """A solver.prototxt (or with `net`, a net file) as a mapping: repeated fields become lists, nested
    messages dicts; inside a nested message a field given more than once becomes a list."""
    tokens = tokenize(text, source)
    reader = _Reader(tokens, source, NET_REPEATED, "net") if net else _Reader(tokens, source)
    return reader.message(None, top=True)
