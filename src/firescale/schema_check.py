"""JSON Schema checks of profiles and experiments: patterns match the whole value, each error one sentence.

A schema `pattern` is searched, and Python's `$` also matches before a final newline, so `^[a-z]+$`
would let `"proj\\n"` through to a job script.  Here every pattern must match the whole string
(`re.fullmatch`), which is what the `^...$` patterns of these schemas mean in ECMA-262 as well.
"""
from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft202012Validator


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _whole_value_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _compiled(pattern).fullmatch(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


StrictValidator = jsonschema.validators.extend(Draft202012Validator, {"pattern": _whole_value_pattern})


def schema_errors(schema: dict[str, Any], instance: Any) -> list[jsonschema.ValidationError]:
    """Every violation of `schema` by `instance`, ordered by key path."""
    errors = StrictValidator(schema).iter_errors(instance)
    return sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), str(e.validator)))


def resolve_ref(root: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


# How a plain YAML scalar at a key path was written (`10:00` where YAML read 600), or None when unknown.
Written = Callable[[Sequence[str | int]], str | None]


def describe(error: jsonschema.ValidationError, root: dict[str, Any], written: Written | None = None) -> str:
    """One sentence: which key, what was found, what is allowed, the known key or value a typo was meant as
    (`root` resolves the schema's $refs; `written` says how a value YAML turned into a number was written)."""
    key = key_path(error)
    schema = _resolved(error.schema, root)
    quoted = _unquoted(error, schema, root, written)
    if quoted:
        return quoted
    if error.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = f"under '{key}'" if error.absolute_path else "at the top level"
        return (f"unknown key {', '.join(repr(e) for e in extra)} {where}{_meant(extra, allowed)}; "
                f"allowed keys: {', '.join(allowed)}")
    if error.validator == "required":
        missing = [r for r in error.validator_value if r not in error.instance]
        where = f"'{key}'" if error.absolute_path else "the top level"
        return f"missing required key {', '.join(repr(m) for m in missing)} in {where}"
    if error.validator == "enum":
        known = ", ".join(sorted(str(v) for v in error.validator_value))
        meant = _meant_value(error.instance, error.validator_value)
        return f"key '{key}': {error.instance!r} is not allowed{meant}; known values: {known}"
    if error.validator == "pattern":
        desc = schema.get("description") or f"text matching {error.validator_value}"
        return f"key '{key}': {error.instance!r} is not allowed; expected {desc}"
    if error.validator == "anyOf":
        return _describe_any_of(error, root, written)
    if error.validator == "type":
        return f"key '{key}': {error.instance!r} is not allowed; expected {_type_words(error.validator_value)}"
    return f"key '{key}': {error.message}"


def _resolved(schema: Any, root: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    return resolve_ref(root, schema["$ref"]) if "$ref" in schema else schema


def _meant(extra: list[str], allowed: list[str]) -> str:
    """' (did you mean 'partition'?)' for a key that is a near miss of an allowed one; else ''."""
    guesses = [(e, m[0]) for e in extra if (m := difflib.get_close_matches(e, allowed, n=1))]
    if not guesses:
        return ""
    if len(extra) == 1:
        return f" (did you mean {guesses[0][1]!r}?)"
    return f" (did you mean {', '.join(f'{m!r} for {e!r}' for e, m in guesses)}?)"


def _meant_value(value: Any, known: Sequence[Any]) -> str:
    words = [str(k) for k in known if isinstance(k, str)]
    match = difflib.get_close_matches(value, words, n=1) if isinstance(value, str) else []
    return f" (did you mean {match[0]!r}?)" if match else ""


def _describe_any_of(error: jsonschema.ValidationError, root: dict[str, Any], written: Written | None) -> str:
    """The one alternative of the instance's own kind (a mapping for a mapping) is described by its own first
    error; otherwise every alternative is named."""
    key = key_path(error)
    branches = [_resolved(s, root) for s in error.validator_value]
    fitting = [i for i, b in enumerate(branches) if _same_kind(error.instance, b)]
    if len(fitting) == 1:
        inner = sorted((e for e in error.context if list(e.relative_schema_path)[:1] == fitting),
                       key=lambda e: (list(map(str, e.absolute_path)), str(e.validator)))
        if inner:
            return describe(inner[0], root, written)
    words = [_alternative_words(b) for b in branches]
    expected = ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
    known = [v for b in branches for v in b.get("enum", [])]
    return f"key '{key}': {error.instance!r} is not allowed{_meant_value(error.instance, known)}; expected {expected}"


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _same_kind(instance: Any, schema: dict[str, Any]) -> bool:
    """Whether `schema` takes values of the instance's kind (mapping, list, text, ...), though maybe not this one."""
    types = schema.get("type")
    if types is None:
        return "enum" in schema and any(type(v) is type(instance) for v in schema["enum"])
    names = [types] if isinstance(types, str) else list(types)
    if isinstance(instance, bool):
        return "boolean" in names
    if isinstance(instance, (int, float)):
        return "number" in names or ("integer" in names and float(instance).is_integer())
    return any(isinstance(instance, _JSON_TYPES[n]) for n in names if n in _JSON_TYPES)


def _alternative_words(schema: dict[str, Any]) -> str:
    """What one alternative of an anyOf takes, in words: its description, else its keys, values or type."""
    if schema.get("description"):
        return str(schema["description"])
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    if schema.get("type") == "object" and schema.get("properties"):
        required = set(schema.get("required", []))
        order = sorted(schema["properties"], key=lambda k: (k not in required, k))
        keys = [f"{k} (required)" if k in required else k for k in order]
        return f"a mapping with the keys {', '.join(keys)}"
    return _type_words(schema.get("type", "value"))


def _unquoted(error: jsonschema.ValidationError, schema: dict[str, Any], root: dict[str, Any],
              written: Written | None) -> str | None:
    """'key K is 600, which YAML read from an unquoted 10:00; quote it: ...' where text was expected and
    YAML turned what was written into a number or true/false; None otherwise."""
    value = error.instance
    if written is None or value is None or not isinstance(value, (bool, int, float)):
        return None
    if error.validator == "type":
        text_schema = schema if "string" in _names(error.validator_value) else None
    elif error.validator == "anyOf":
        text_schema = next((b for b in (_resolved(s, root) for s in error.validator_value)
                            if "string" in _names(b.get("type"))), None)
    else:
        return None
    text = written(list(error.absolute_path))
    if text_schema is None or text is None or _read_as(text) != value:
        return None
    name = str(error.absolute_path[-1]) if error.absolute_path else "value"
    found = json.dumps(value)
    said = (f"key '{key_path(error)}' is the number {found}, where text is expected" if text == found
            else f"key '{key_path(error)}' is {found}, which YAML read from an unquoted {text}")
    check = StrictValidator({**text_schema, "$defs": root.get("$defs", {})})
    if check.is_valid(text):
        return f'{said}; quote it: {name}: "{text}"'
    form = text_schema.get("description") or "text"
    if isinstance(value, int) and not isinstance(value, bool) and ":" in text:   # YAML 1.1's base 60: seconds
        hours, rest = divmod(value, 3600)
        seconds = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
        if check.is_valid(seconds):
            return f'{said}; quote it, in the form {form}: {name}: "{seconds}" ({value} s, as YAML read it)'
    return f'{said}; quote it, in the form {form}: {name}: "..."'


def _read_as(text: str) -> Any:
    """What YAML makes of `text` as a plain scalar."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _names(types: Any) -> list[str]:
    if types is None:
        return []
    return [types] if isinstance(types, str) else list(types)


_TYPE_WORDS = {"object": "a mapping of keys", "array": "a list", "string": "text", "integer": "a whole number",
               "number": "a number", "boolean": "true or false", "null": "null"}


def _type_words(types: Any) -> str:
    names = [types] if isinstance(types, str) else list(types)
    return " or ".join(_TYPE_WORDS.get(t, t) for t in names)
