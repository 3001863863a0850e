"""The experiments file (workflow/config.yaml): read, fill in the schema's defaults, validate."""
from __future__ import annotations

import copy
import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from firescale.cluster.site import apply_defaults
from firescale.errors import FirescaleError
from firescale.resources import CONFIG_SCHEMA, schema_text
from firescale.schema_check import describe, schema_errors
from firescale.yamlfile import load_yaml


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
    """A copy of `config` with the schema's defaults filled in; the first schema error names the key."""
    schema = config_schema()
    config = copy.deepcopy(config)
    experiments = config.get("experiments")
    for exp in (experiments.values() if isinstance(experiments, dict) else ()):
        if isinstance(exp, dict):
            apply_defaults(schema["$defs"]["experiment"], exp, schema)
    errors = schema_errors(schema, config)
    if errors:
        raise FirescaleError(f"{source}: {describe(errors[0], schema)}")
    return config


def experiments_for(config: dict[str, Any], site: str) -> list[str]:
    """The experiments that list `site` under their `sites`."""
    return sorted(name for name, exp in config["experiments"].items() if site in exp["sites"])
