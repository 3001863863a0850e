"""Site fixtures shared by the tests of this folder: copies of shipped sites with edits."""
from __future__ import annotations

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
