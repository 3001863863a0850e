"""Quoted strings in Caffe's text format read as protobuf's text parser reads them: UTF-8 text, C's escapes."""
from __future__ import annotations

import pytest

from firescale.caffe.prototxt import parse_prototxt
from firescale.errors import FirescaleError


def _name(quoted: str) -> str:
    return parse_prototxt(f"name: {quoted}\n", "net.prototxt", net=True)["name"]


@pytest.mark.parametrize(("quoted", "text"), [
    ('"café"', "café"),                       # UTF-8 text stays itself (unicode_escape made it cafÃ©)
    ('"caf\\303\\251"', "café"),              # octal escapes are bytes, read as UTF-8 with the rest
    ('"caf\\xc3\\xa9"', "café"),              # hex escapes likewise
    ('"caf\\u00e9"', "café"),
    ('"\\U0001F600"', "\U0001F600"),
    ('"a\\tb\\nc\\\\d\\"e\\\'f\\?"', "a\tb\nc\\d\"e'f?"),
    ("'single \"quoted\"'", 'single "quoted"'),
    ('"conv" "1"', "conv1"),                  # adjacent literals join, as in C
    ('"\\101\\x42"', "AB"),
    ('"日本語 net"', "日本語 net"),
])
def test_a_quoted_string_reads_as_caffes_parser_reads_it(quoted: str, text: str) -> None:
    assert _name(quoted) == text


@pytest.mark.parametrize(("quoted", "said"), [
    ('"a\\qb"', "is not an escape Caffe's text format knows"),
    ('"caf\\303"', "is not UTF-8 once its escapes are read"),
    ('"\\uD800"', "is not a Unicode code point"),
])
def test_a_bad_escape_is_one_sentence_naming_the_file(quoted: str, said: str) -> None:
    with pytest.raises(FirescaleError) as caught:
        _name(quoted)
    message = str(caught.value)
    assert message.startswith("net.prototxt: ") and said in message and "\n" not in message
