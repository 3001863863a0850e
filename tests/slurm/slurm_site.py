"""The site profile of the test Slurm (one node, two CPUs standing in for two GPUs, mpirun), with edits."""
from __future__ import annotations

from pathlib import Path

import yaml

from firescale.cluster.site import SiteProfile, load_site

REPO = Path(__file__).resolve().parents[2]


def slurm_here(tmp_path: Path, **edits) -> SiteProfile:
    """site/ib-cluster made to fit the test Slurm; `edits` replace top-level keys."""
    data = yaml.safe_load((REPO / "site" / "ib-cluster" / "site.yaml").read_text())
    data.update(name="slurm-here", launcher="mpirun", launcher_options=["--oversubscribe"], partition="debug",
                environment={"variables": {}}, limits={**data["limits"], "max_nodes": 1})
    data["node"] = {"gpus": 2, "cores": 2, "memory_gb": 4}
    # a CPU core stands in for a GPU: it computes on host memory, so no host-to-device copy
    data["device"] = {**{k: v for k, v in data["device"].items() if k != "host_to_device_gbs"}, "kind": "cpu"}
    data.update(edits)
    path = tmp_path / "slurm-here" / "site.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return load_site(path)
