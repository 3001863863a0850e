"""Which experiments file a command reads, and the project folder its relative paths are read from."""
from __future__ import annotations

import os
from pathlib import Path

from firescale.errors import FirescaleError

CONFIG_FILE = Path("workflow") / "config.yaml"
CALIBRATION_FILE = "calibration.json"   # what a calibration is saved as, in the workflow and by default


def default_config_file() -> Path:
    """The experiments a command reads when given none: ./workflow/config.yaml, as Snakemake reads it."""
    if CONFIG_FILE.is_file():
        return CONFIG_FILE
    raise FirescaleError(f"no experiments file: {CONFIG_FILE} is not in {Path.cwd()}; run the command in the "
                         f"project folder (the one holding workflow/) or give --config FILE")


def config_file(given: str | os.PathLike[str] | None) -> Path:
    """The experiments file named on the command line, or the default one."""
    return Path(given) if given else default_config_file()


def project_dir(config_path: str | os.PathLike[str]) -> Path:
    """The folder an experiments file's relative paths (solver, layer_plan) are read from: the folder that
    holds workflow/ for a file inside workflow/ (where Snakemake runs), else the file's own folder."""
    folder = Path(os.path.abspath(config_path)).parent
    return folder.parent if folder.name == "workflow" else folder


def resolve(path: str | os.PathLike[str], base: Path) -> Path:
    """`path` as given when absolute, else inside `base` (the project folder)."""
    path = Path(path)
    return path if path.is_absolute() else base / path
