"""An experiment's net: a built-in name, or a Caffe net file of the project, checked before anything runs."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from firescale.data.manifest import MANIFEST, manifest_if_ingested
from firescale.errors import FirescaleError
from firescale.nets.spec import Shape
from firescale.nets.zoo import NET_NAMES, is_net_file
from firescale.results import file_record
from firescale.sweep.paths import resolve


def experiment_net(net: str, base: Path) -> str:
    """The net as `firescale train --net` takes it: a built-in name as given, a net file as an absolute path
    (a relative one is read from `base`, the project folder)."""
    return os.path.abspath(resolve(net, base)) if is_net_file(net) else net


def manifest_input(manifest: dict[str, Any], exp: dict[str, Any], path: Path, net: str) -> tuple[Shape, int]:
    """The input (H, W, C) the experiment's `net` reads from its ingested dataset, and the dataset's classes: the
    manifest's shape, cropped as the trainer crops it (the experiment's crop, else the crop_size of the net
    file's TRAIN data layer)."""
    from firescale.train.data_layers import train_crop

    try:
        stored = tuple(int(v) for v in manifest["shape"])
        classes = int(manifest["num_classes"])
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{path}: a manifest needs shape and num_classes") from None
    crop = (exp["dataset"].get("transform") or {}).get("crop") or train_crop(net)
    return ((int(crop), int(crop), stored[2]) if crop else (stored[0], stored[1], stored[2])), classes


def check_experiment_net(name: str, exp: dict[str, Any], base: Path, dataset_dir: Path, source: str) -> None:
    """A net file the experiment names exists and loads: its layers and their DAG always, its shapes with the
    ingested dataset's input (or the file's own before ingest); one sentence naming the experiment and file."""
    from firescale.nets.caffe_file import check_net_file

    net = exp["net"]
    if not is_net_file(net):
        return
    path = Path(experiment_net(net, base))
    where = f"{source}: experiment {name}: key 'net' names the net file {net!r}"
    if not path.is_file():
        raise FirescaleError(f"{where}, but {path} does not exist; give a Caffe net file (.prototxt) relative to "
                             f"the project folder {base} or as an absolute path, or a built-in net: "
                             f"{', '.join(NET_NAMES)}")
    manifest = manifest_if_ingested(dataset_dir)
    shape, classes = manifest_input(manifest, exp, dataset_dir / MANIFEST, str(path)) if manifest else (None, None)
    try:
        check_net_file(path, input_shape=shape, num_classes=classes)
    except FirescaleError as exc:
        raise FirescaleError(f"{where}, which firescale cannot use: {exc}") from None


def check_experiment_mean(name: str, exp: dict[str, Any], base: Path, source: str) -> None:
    """The mean the experiment's runs subtract is there before anything runs: the mean file its
    `dataset.transform.mean` names (relative to the project folder `base`), else the `mean_file` of its net
    file's TRAIN data layer, which the runs read beside the net file (their working directory is their run
    folder, where it never is); one sentence naming the experiment, the key or layer, and the file."""
    from firescale.train.data_layers import data_param, read_data_layers

    where = f"{source}: experiment {name}"
    mean = (exp["dataset"].get("transform") or {}).get("mean")
    if isinstance(mean, str):
        path = Path(resolve(mean, base))
        if not path.is_file():
            raise FirescaleError(f"{where}: key 'dataset.transform.mean' names the mean file {mean!r}, but {path} "
                                 f"does not exist; give a mean file (.binaryproto or .npy) relative to the project "
                                 f"folder {base} or as an absolute path, or per-channel values such as [104, 117, 123]")
        return
    if mean or not is_net_file(exp["net"]):
        return
    layers = read_data_layers(experiment_net(exp["net"], base))
    layer, param = layers.train, data_param(layers.train)
    if layer is None or param is None or not param.mean_file or param.mean_value:
        return
    beside = Path(layers.source).parent / param.mean_file
    if not beside.is_file():
        raise FirescaleError(f"{where}: {layers.where(layer, 'transform_param mean_file')}: {param.mean_file!r} is "
                             f"not at {beside}, where the runs would read it (beside the net file); set the "
                             f"experiment's dataset.transform.mean to the mean file or to per-channel values")


def net_file_digest(net: str) -> dict[str, str] | None:
    """The path and sha256 of a net file (None for a built-in net), so that a report says which file ran."""
    if not is_net_file(net):
        return None
    try:
        return file_record(net)
    except OSError as exc:
        return {"path": net, "sha256": f"unreadable ({exc.strerror})"}
