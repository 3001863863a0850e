"""What ships inside the package, read with importlib.resources: job-script templates and the two schemas."""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

SITE_SCHEMA = "site.schema.json"
CONFIG_SCHEMA = "config.schema.yaml"


def schema_text(name: str) -> str:
    """The text of a schema that ships with the package (SITE_SCHEMA or CONFIG_SCHEMA)."""
    return resources.files("firescale").joinpath("schemas", name).read_text(encoding="utf-8")


def templates() -> Traversable:
    """The job-script templates that ship with the package (the repository's templates/)."""
    return resources.files("firescale").joinpath("templates")
