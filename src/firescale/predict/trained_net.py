"""The net an experiment trains: its input shape and classes from the dataset's manifest and crop."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from firescale.errors import FirescaleError
from firescale.nets.spec import NetSpec
from firescale.nets.zoo import get_net
from firescale.sweep.plan import SweepPlan


@dataclass(frozen=True)
class TrainedNet:
    """The experiment's net as it trains on the site's copy of its dataset, and what the manifest counts
    (train_records None: no manifest yet, the net's own input and classes)."""

    spec: NetSpec
    train_records: int | None
    test_records: int
    manifest: Path


def trained_net(plan: SweepPlan, experiment: str) -> TrainedNet:
    """The net as `experiment` trains it on `plan`'s site: input shape from the manifest and the crop,
    the manifest's classes, and its train and test records."""
    exp = plan.experiment(experiment)
    manifest, path = plan.dataset_manifest(experiment)
    crop = (exp["dataset"].get("transform") or {}).get("crop")
    if manifest is None:
        spec = get_net(exp["net"])
        if crop:
            spec = get_net(exp["net"], input_shape=(int(crop), int(crop), spec.input_shape[2]))
        return TrainedNet(spec, None, 0, path)
    try:
        records = int(manifest["splits"]["train"]["records"])
        test_records = int(manifest["splits"].get("test", {}).get("records", 0))
        stored = tuple(int(v) for v in manifest["shape"])
        classes = int(manifest["num_classes"])
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{path}: a manifest needs splits.train.records, shape and num_classes") from None
    shape = (int(crop), int(crop), stored[2]) if crop else stored
    return TrainedNet(get_net(exp["net"], num_classes=classes, input_shape=shape), records, test_records, path)
