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


def project_folder(config_path: str | os.PathLike[str] | None = None) -> Path:
    """The project folder, which relative paths of an experiments file (solver, net, mean, layer_plan) are
    read from, as Snakemake reads them: the folder holding workflow/config.yaml, found from the working
    directory up.  Where the working directory lies in no project, the project of a file given inside a
    workflow/ folder; else the working directory.  Never the experiments file's own folder: `--config
    mine/c.yaml` reads `workflow/solvers/...` from the project, as `--configfile mine/c.yaml` does."""
    cwd = Path.cwd().resolve()
    for folder in (cwd, *cwd.parents):
        if (folder / CONFIG_FILE).is_file():
            return folder
    if config_path is not None:
        folder = Path(os.path.abspath(config_path)).parent
        if folder.name == "workflow":
            return folder.parent.resolve()
    return cwd


def resolve(path: str | os.PathLike[str], base: Path) -> Path:
    """`path` as given when absolute, else inside `base` (the project folder)."""
    path = Path(path)
    return path if path.is_absolute() else base / path


def portable(path: str | os.PathLike[str], folder: Path) -> str:
    """`path` (absolute) relative to `folder` where it lies inside it, else as it is."""
    path = Path(path)
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)
