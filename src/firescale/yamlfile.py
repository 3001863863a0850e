"""YAML files read strictly (a key given twice in one mapping is an error naming the file, line and key), and
how a value was written there (the text YAML turned into a number)."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from firescale.errors import FirescaleError
from firescale.userfile import read_user_text


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"key {key!r} is given twice (lines {first_line} and {line})")
        self.line = line


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping may name each key once (PyYAML keeps the last)."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` may be overridden on purpose
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # the constructor below names an unhashable key itself
        line = key_node.start_mark.line + 1
        if key in seen:
            raise _DuplicateKey(key, line, seen[key])
        seen[key] = line
    return loader.construct_mapping(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse_yaml(text: str, source: str | os.PathLike[str]) -> Any:
    """The YAML document in `text`; any problem is one sentence naming `source` and the line."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as exc:
        raise FirescaleError(f"{source}: line {exc.line}: {exc}; YAML would silently keep the last one") from None
    except yaml.reader.ReaderError as exc:   # a character YAML does not allow (a control character, say)
        line = text.count("\n", 0, exc.position) + 1
        raise FirescaleError(f"{source}: line {line} holds character {exc.character:#04x}, which YAML does not allow "
                             "(a control character); expected printable text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise FirescaleError(f"{source}:{where} is not valid YAML: {getattr(exc, 'problem', None) or exc}") from None


def load_yaml(path: str | os.PathLike[str], what: str = "YAML file") -> Any:
    """Read and parse `path` strictly; a missing or unreadable file names `what` it is."""
    path = Path(path)
    return parse_yaml(read_user_text(path, what), path)


def written_as(text: str, path: Sequence[str | int]) -> str | None:
    """How the value at key path `path` of the YAML `text` was written, when it is a plain (unquoted)
    scalar: the text YAML turned into a number or true/false (`10:00` for 600); else None."""
    try:
        node: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    node = _node_at(node, path)
    return node.value if isinstance(node, yaml.ScalarNode) and node.style is None else None


def _node_at(node: yaml.Node | None, path: Sequence[str | int]) -> yaml.Node | None:
    for part in path:
        if isinstance(node, yaml.MappingNode):
            node = next((value for key, value in node.value
                         if isinstance(key, yaml.ScalarNode) and key.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            return None
    return node


def written_in(path: str | os.PathLike[str]) -> Callable[[Sequence[str | int]], str | None]:
    """`written_as` over the YAML file at `path`, read when asked (None for a file that cannot be read)."""
    def written(parts: Sequence[str | int]) -> str | None:
        try:
            return written_as(Path(path).read_text(encoding="utf-8"), parts)
        except (OSError, UnicodeDecodeError):
            return None
    return written
