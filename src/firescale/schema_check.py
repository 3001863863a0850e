"""JSON Schema checks of profiles and experiments: patterns match the whole value, each error one sentence.

A schema `pattern` is searched, and Python's `$` also matches before a final newline, so `^[a-z]+$`
would let `"proj\\n"` through to a job script.  Here every pattern must match the whole string
(`re.fullmatch`), which is what the `^...$` patterns of these schemas mean in ECMA-262 as well.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import jsonschema
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


def describe(error: jsonschema.ValidationError, root: dict[str, Any]) -> str:
    """One sentence: which key, what is wrong, what is allowed (`root` resolves the schema's $refs)."""
    key = key_path(error)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = f"under '{key}'" if error.absolute_path else "at the top level"
        return f"unknown key {', '.join(repr(e) for e in extra)} {where}; allowed keys: {', '.join(allowed)}"
    if error.validator == "required":
        missing = [r for r in error.validator_value if r not in error.instance]
        where = f"'{key}'" if error.absolute_path else "the top level"
        return f"missing required key {', '.join(repr(m) for m in missing)} in {where}"
    if error.validator == "enum":
        known = ", ".join(sorted(str(v) for v in error.validator_value))
        return f"key '{key}': {error.instance!r} is not allowed; known values: {known}"
    if error.validator == "pattern":
        desc = schema.get("description") or f"text matching {error.validator_value}"
        return f"key '{key}': {error.instance!r} is not allowed; expected {desc}"
    if error.validator == "anyOf":
        hints = [s.get("description") for s in error.validator_value if isinstance(s, dict)]
        hints += [resolve_ref(root, s["$ref"]).get("description") for s in error.validator_value
                  if isinstance(s, dict) and "$ref" in s]
        hint = "; ".join(h for h in hints if h) or "see the schema"
        nullable = any(isinstance(s, dict) and s.get("type") == "null" for s in error.validator_value)
        return f"key '{key}': {error.instance!r} is not allowed; expected {hint}" + (" (or null)" if nullable else "")
    if error.validator == "type":
        return f"key '{key}': {error.instance!r} is not allowed; expected {_type_words(error.validator_value)}"
    return f"key '{key}': {error.message}"


_TYPE_WORDS = {"object": "a mapping of keys", "array": "a list", "string": "text", "integer": "a whole number",
               "number": "a number", "boolean": "true or false", "null": "nothing (null)"}


def _type_words(types: Any) -> str:
    names = [types] if isinstance(types, str) else list(types)
    return " or ".join(_TYPE_WORDS.get(t, t) for t in names)
