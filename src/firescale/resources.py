"""What ships inside the package: the two schemas, the job templates and Caffe's own net files (nets/caffe_zoo)."""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

SITE_SCHEMA = "site.schema.json"
CONFIG_SCHEMA = "config.schema.yaml"
TEMPLATES = "templates"   # the package folder of the job-script templates (the repository's templates/)


def schema_text(name: str) -> str:
    """The text of a schema that ships with the package (SITE_SCHEMA or CONFIG_SCHEMA)."""
    return resources.files("firescale").joinpath("schemas", name).read_text(encoding="utf-8")


def caffe_zoo_file(relative: str) -> Traversable:
    """A Caffe net file shipped in nets/caffe_zoo, e.g. "bvlc_alexnet/train_val.prototxt"."""
    return resources.files("firescale").joinpath("nets", "caffe_zoo", *relative.split("/"))
