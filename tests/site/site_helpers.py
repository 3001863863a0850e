"""Site fixtures shared by the tests of this folder: copies of shipped sites with edits."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def one_link(d: dict[str, Any]) -> None:
    """A site as firescale read it before two-level links and storage: one link for every hop, no read time."""
    d["interconnect"].pop("intra_node", None)
    d.pop("storage", None)
    d["device"].pop("host_to_device_gbs", None)


def site_copy(tmp_path: Path, name: str, edit=None, *, folder: str | None = None) -> Path:
    """Copy site/<name>/site.yaml into tmp_path/<folder or name>/, applying `edit(dict)`; return the file."""
    data: dict[str, Any] = yaml.safe_load((REPO / "site" / name / "site.yaml").read_text())
    if edit:
        edit(data)
    target = tmp_path / (folder or name) / "site.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return target


def site_folder_copy(tmp_path: Path, name: str, *edits: tuple[str, str], folder: str | None = None) -> Path:
    """Copy the whole folder site/<name>/ (site.yaml and its profile) into tmp_path/<folder or name>/, with
    each (old, new) replaced once in site.yaml's text as written, comments and quoting kept; return the folder."""
    target = tmp_path / (folder or name)
    shutil.copytree(REPO / "site" / name, target)
    text = (target / "site.yaml").read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not once in site/{name}/site.yaml"
        text = text.replace(old, new)
    (target / "site.yaml").write_text(text)
    return target
