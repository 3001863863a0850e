"""Run records for the store's tests: the report tests' hand-made sweep, copied with new numbers."""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

RUNS = Path(__file__).resolve().parents[1] / "report" / "data" / "runs"
POINTS = ("baseline", "g2-b64-r0", "g2-b64-r1", "g2-b128-r0", "g2-b256-r0")


def hand_made(point: str) -> dict[str, Any]:
    return json.loads((RUNS / point / "result.json").read_text())


def repeat_of(point: str, repeat: int, *, iteration_s: float | None = None, seed: int = 0,
              experiment: str | None = None, site: str | None = None, commit: str | None = None,
              versions: dict[str, str] | None = None) -> dict[str, Any]:
    """The hand-made record of `point`, as its repeat `repeat` with an iteration of `iteration_s` seconds
    (train time scaled alike) and a seed of its own, so that its record, and so its identity, is new."""
    base_name = point.rsplit("-r", 1)[0] if point != "baseline" else "baseline"
    raw = copy.deepcopy(hand_made(point))
    raw["point"] = (f"baseline-r{repeat}" if repeat else "baseline") if raw["baseline"] else f"{base_name}-r{repeat}"
    raw["repeat"] = repeat
    train = raw["train"]
    train["seed"] = seed
    if iteration_s is not None:
        split = train["per_iteration"]
        old = split["data_wait_s"] + split["compute_s"] + split["allreduce_s"]
        factor = iteration_s / old
        for key in ("data_wait_s", "compute_s", "allreduce_s"):
            split[key] *= factor
        train["train_time_s"] *= factor
        train["time_to_accuracy_s"] = train["train_time_s"] if train["time_to_accuracy_s"] else None
        for e in train["evals"]:
            e["wall_s"] *= factor
        for s in train["segments"]:
            s["train_s"] *= factor
    if experiment:
        raw["experiment"] = experiment
    if site:
        raw["site"] = site
    if commit:
        train["versions"]["commit"] = commit
    if versions:
        train["versions"].update(versions)
    return raw


def noisy_sweep(rng: random.Random, repeats: int, *, slower: float = 1.0, **options: Any) -> list[dict[str, Any]]:
    """One sweep of the hand-made points, `repeats` each, iterations drawn around the hand-made ones (2% noise)
    and `slower` times as long."""
    out = []
    for point in ("baseline", "g2-b64-r0", "g2-b256-r0"):
        split = hand_made(point)["train"]["per_iteration"]
        mean = split["data_wait_s"] + split["compute_s"] + split["allreduce_s"]
        for r in range(repeats):
            out.append(repeat_of(point, r, iteration_s=mean * slower * rng.gauss(1.0, 0.02),
                                 seed=rng.randrange(1 << 30), **options))
    return out


def write_sweep(folder: Path, records: list[dict[str, Any]]) -> Path:
    """The records as a sweep's runs/ folder."""
    for raw in records:
        (folder / raw["point"]).mkdir(parents=True, exist_ok=True)
        (folder / raw["point"] / "result.json").write_text(json.dumps(raw, indent=1, sort_keys=True))
    return folder
