"""The `local` site with its datasets and results in a scratch folder holding the digits, and a short solver."""
from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from firescale.cluster.site import SiteProfile, load_site


def short_solver(max_iter: int) -> str:
    """LeNet's solver at a fixed rate for `max_iter` iterations at the baseline batch, evaluating every 10."""
    return (f"type: SGD\nbase_lr: 0.01\nlr_policy: fixed\nmomentum: 0.9\nmax_iter: {max_iter}\n"
            "test_interval: 10\ndisplay: 10\nsnapshot: 100\nrandom_seed: 1\n")


def scratch_local_site(root: Path, run_ranks: Callable, max_iter: int) -> tuple[SiteProfile, Path]:
    """`local` with paths under `root`, the digits ingested there, and root/short.yaml (short_solver)."""
    run_ranks(1, ["data", "ingest", "--source", "digits", "--out", str(root / "datasets")])
    (root / "short.yaml").write_text(short_solver(max_iter))
    local = load_site("local")
    config = copy.deepcopy(local.config)
    config["paths"] = {"datasets": str(root / "datasets"), "scratch": str(root / "scratch"),
                       "results": str(root / "results")}
    return SiteProfile(name=local.name, source=local.source, config=config), root / "short.yaml"
