"""The net an experiment trains: its input shape and classes from the dataset's manifest and crop."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from firescale.errors import FirescaleError
from firescale.nets.caffe_file import check_net_file
from firescale.nets.spec import NetSpec
from firescale.nets.zoo import get_net, is_net_file
from firescale.sweep.net_file import manifest_input
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
    """The net as `experiment` trains it on `plan`'s site: input shape from the manifest and the trainer's crop,
    the manifest's classes, and its train and test records."""
    exp, net = plan.experiment(experiment), plan.net(experiment)
    manifest, path = plan.dataset_manifest(experiment)
    crop = (exp["dataset"].get("transform") or {}).get("crop")
    if manifest is None:
        if is_net_file(net) and check_net_file(net) is None:
            raise FirescaleError(f"experiment {experiment}: the net file {net} does not give its input's size and "
                                 f"dataset {exp['dataset']['name']!r} is not ingested yet (no {path}); ingest it "
                                 f"first (firescale data ingest, or the workflow's ingest rule)")
        spec = get_net(net)
        if crop:
            spec = get_net(net, input_shape=(int(crop), int(crop), spec.input_shape[2]))
        return TrainedNet(spec, None, 0, path)
    shape, classes = manifest_input(manifest, exp, path, net)
    try:
        records = int(manifest["splits"]["train"]["records"])
        test_records = int(manifest["splits"].get("test", {}).get("records", 0))
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{path}: a manifest needs splits.train.records, shape and num_classes") from None
    return TrainedNet(get_net(net, num_classes=classes, input_shape=shape), records, test_records, path)
