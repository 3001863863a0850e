"""The experiments file (workflow/config.yaml): read, fill in the schema's defaults, validate."""
from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from firescale.cluster.site import apply_defaults
from firescale.errors import FirescaleError
from firescale.resources import CONFIG_SCHEMA, schema_text
from firescale.schema_check import describe, schema_errors
from firescale.yamlfile import load_yaml, written_in


@cache
def _schema_text() -> str:
    return schema_text(CONFIG_SCHEMA)


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the experiments file (a fresh copy)."""
    return yaml.safe_load(_schema_text())


def load_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """workflow/config.yaml validated against its schema, with defaults; errors name the file and key."""
    path = Path(path)
    config = load_yaml(path, "experiments file")
    if not isinstance(config, dict):
        raise FirescaleError(f"{path}: an experiments file must be a mapping with the keys 'site' and 'experiments', "
                             f"not {'an empty file' if config is None else type(config).__name__}")
    config.update(overrides or {})
    return validate_config(config, path)


def validate_config(config: dict[str, Any], source: str | os.PathLike[str] = "workflow/config.yaml") -> dict[str, Any]:
    """A copy of `config` with the schema's defaults filled in; the first schema error names the key (and,
    where `source` is the file it was read from, how a value YAML turned into a number was written there)."""
    checked, error, schema = _checked(config)
    if error is not None:
        raise FirescaleError(f"{source}: {describe(error, schema, written_in(source))}")
    return checked


def check_workflow_config(config: dict[str, Any], files: Sequence[str | os.PathLike[str]]) -> None:
    """The workflow's config (Snakemake's config files merged, then the profile's and the command line's
    --config) checked as `validate_config` checks one file, with the schema's defaults written into
    `config` itself as snakemake.utils.validate wrote them.  The first error names the last of `files`
    that gives the key it is about, else the command line's or the profile's --config."""
    checked, error, schema = _checked(config)
    if error is not None:
        parts, value = list(error.absolute_path), error.instance
        if error.validator == "additionalProperties":    # the unknown key itself is where it was written
            extra = sorted(set(value) - set(error.schema.get("properties", {})))[0]
            parts, value = [*parts, extra], value[extra]
        elif "propertyNames" in error.absolute_schema_path:   # a key its names' pattern refuses: where it was written
            parts, value = [*parts, value], _at(checked, parts)[value]
        holder = next((Path(f) for f in reversed(files) if _gives(f, parts, value)), None)
        where = str(holder) if holder else "the workflow's --config (the command line or the profile)"
        raise FirescaleError(f"{where}: {describe(error, schema, written_in(holder) if holder else None)}")
    config.update(checked)


def _checked(config: dict[str, Any]) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """A copy of `config` with defaults, its first schema error (or None), and the schema."""
    schema = config_schema()
    config = copy.deepcopy(config)
    experiments = config.get("experiments")
    # the backend of experiments that name none; a value the schema refuses is blamed on the key itself
    default_framework = config.get("framework")
    if default_framework not in schema["properties"]["framework"]["enum"]:
        default_framework = None
    for exp in (experiments.values() if isinstance(experiments, dict) else ()):
        if isinstance(exp, dict):
            if default_framework is not None:
                exp.setdefault("framework", default_framework)
            apply_defaults(schema["$defs"]["experiment"], exp, schema)
    errors = schema_errors(schema, config)
    return config, (errors[0] if errors else None), schema


def _at(config: Any, parts: list[str | int]) -> Any:
    """The value at key path `parts` of `config`."""
    for part in parts:
        config = config[part]
    return config


def _gives(path: str | os.PathLike[str], parts: list[str | int], value: Any) -> bool:
    """Whether the config file at `path` gives `value` at key path `parts` (a mapping: any value there,
    as Snakemake merges mappings key by key)."""
    try:
        node = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return False
    return isinstance(value, dict) or node == value


def experiments_for(config: dict[str, Any], site: str) -> list[str]:
    """The experiments that list `site` under their `sites`."""
    return sorted(name for name, exp in config["experiments"].items() if site in exp["sites"])
