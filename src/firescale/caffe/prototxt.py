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
            tokens.append(("str", bytes(quoted[1:-1], "utf-8").decode("unicode_escape")))
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
