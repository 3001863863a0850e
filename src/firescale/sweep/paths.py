"""Where the repository is, which experiments file a command reads, and repository-relative paths."""
from __future__ import annotations

from pathlib import Path

CONFIG_FILE = Path("workflow") / "config.yaml"
SCHEMA_FILE = Path("workflow") / "schemas" / "config.schema.yaml"


def repo_root() -> Path:
    """The repository this package runs from (src/firescale/sweep/ is three levels below it)."""
    return Path(__file__).resolve().parents[3]


def default_config_file() -> Path:
    """The experiments a command reads when given none: ./workflow/config.yaml, else the repository's."""
    local = CONFIG_FILE
    return local if local.is_file() else repo_root() / CONFIG_FILE


def config_file(given: str | Path | None) -> Path:
    """The experiments file named on the command line, or the default one."""
    return Path(given) if given else default_config_file()


def in_repo(path: str | Path) -> Path:
    """`path` as given when absolute, else relative to the repository (solver files, schemas)."""
    path = Path(path)
    return path if path.is_absolute() else repo_root() / path
