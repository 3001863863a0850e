"""The experiments file (workflow/config.yaml): read, fill in the schema's defaults, validate."""
from __future__ import annotations

import copy
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ..errors import FirescaleError
from ..site import apply_defaults
from .paths import SCHEMA_FILE, repo_root


@lru_cache(maxsize=None)
def _schema_text() -> str:
    return (repo_root() / SCHEMA_FILE).read_text()


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the experiments file (a fresh copy)."""
    return yaml.safe_load(_schema_text())


def load_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """workflow/config.yaml validated against its schema, with defaults; errors name the file and key."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FirescaleError(f"{path}: cannot read experiments: {exc}") from None
    if not isinstance(config, dict):
        raise FirescaleError(f"{path}: the experiments file must be a YAML mapping with 'site' and 'experiments'")
    config.update(overrides or {})
    return validate_config(config, path)


def validate_config(config: dict[str, Any], source: str | os.PathLike[str] = "workflow/config.yaml") -> dict[str, Any]:
    """A copy of `config` with the schema's defaults filled in; the first schema error names the key."""
    schema = config_schema()
    config = copy.deepcopy(config)
    for exp in (config.get("experiments") or {}).values():
        if isinstance(exp, dict):
            apply_defaults(schema["$defs"]["experiment"], exp, schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        e = errors[0]
        key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise FirescaleError(f"{source}: key '{key}': {e.message}")
    return config


def experiments_for(config: dict[str, Any], site: str) -> list[str]:
    """The experiments that list `site` under their `sites`."""
    return sorted(name for name, exp in config["experiments"].items() if site in exp["sites"])
