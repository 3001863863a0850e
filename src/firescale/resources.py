"""What ships inside the package: the two schemas (read with importlib.resources) and the job templates."""
from __future__ import annotations

from importlib import resources

SITE_SCHEMA = "site.schema.json"
CONFIG_SCHEMA = "config.schema.yaml"
TEMPLATES = "templates"   # the package folder of the job-script templates (the repository's templates/)


def schema_text(name: str) -> str:
    """The text of a schema that ships with the package (SITE_SCHEMA or CONFIG_SCHEMA)."""
    return resources.files("firescale").joinpath("schemas", name).read_text(encoding="utf-8")
