"""Layer-to-device plans (Oh and Lee's `dist { arch { layer_assign } }`): read, write, check against a net."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firescale.caffe.prototxt import PLAN_KEY, parse_prototxt
from firescale.errors import FirescaleError
from firescale.nets.spec import Inception, Layer, NetSpec
from firescale.yamlfile import parse_yaml


@dataclass(frozen=True)
class LayerAssign:
    """From layer `name` on (in the net's order), the layers run on device `device`."""

    name: str
    device: int


@dataclass(frozen=True)
class DevicePlan:
    """Where each replica's layers run: `train` holds one arch (a list of device changes) per replica,
    `test` the arches of the test nets; `source` names the file in errors."""

    train: tuple[tuple[LayerAssign, ...], ...]
    test: tuple[tuple[LayerAssign, ...], ...] = ()
    source: str = "layer plan"

    @property
    def replicas(self) -> int:
        return len(self.train)

    @property
    def devices(self) -> int:
        """Devices one replica uses: the highest device any arch names, plus one."""
        return 1 + max(a.device for arch in (*self.train, *self.test) for a in arch)


# ---------------------------------------------------------------- reading


def _fields(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """A message read by caffe.prototxt as (key, value) pairs in order, a repeated key once per value and
    nested messages likewise."""
    return [(key, _fields(v) if isinstance(v, dict) else v)
            for key, value in message.items() for v in (value if isinstance(value, list) else [value])]


def _assign(fields: Any, where: str) -> LayerAssign:
    if not isinstance(fields, list):
        raise FirescaleError(f"{where}: layer_assign must be a block {{ name: ... device: ... }}")
    values = dict(fields)
    if set(values) != {"name", "device"} or len(fields) != 2:
        raise FirescaleError(f"{where}: layer_assign needs exactly 'name' and 'device', found "
                             f"{', '.join(k for k, _ in fields) or 'nothing'}")
    name, device = str(values["name"]).lstrip("\""), str(values["device"])
    if not re.fullmatch(r"\d+", device):
        raise FirescaleError(f"{where}: layer_assign {name!r} has device {device!r}; a device is a number 0, 1, ...")
    return LayerAssign(name, int(device))


def _arches(fields: list[tuple[str, Any]], where: str) -> tuple[tuple[LayerAssign, ...], ...]:
    arches: list[tuple[LayerAssign, ...]] = []
    for key, value in fields:
        if key != "arch" or not isinstance(value, list):
            raise FirescaleError(f"{where}: a dist block holds 'arch {{ ... }}' blocks, not {key!r}")
        at = f"{where} arch {len(arches)}"
        assigns = []
        for k, v in value:
            if k != "layer_assign":
                raise FirescaleError(f"{at}: an arch holds 'layer_assign {{ ... }}' blocks, not {k!r}")
            assigns.append(_assign(v, at))
        if not assigns:
            raise FirescaleError(f"{at}: an arch needs at least one layer_assign")
        arches.append(tuple(assigns))
    if not arches:
        raise FirescaleError(f"{where}: a dist block needs at least one arch")
    return tuple(arches)


def plan_from_prototxt(text: str, source: str) -> DevicePlan | None:
    """The `dist` blocks of a Caffe solver.prototxt (the first for training, the second for testing)."""
    dists = parse_prototxt(text, source).get(PLAN_KEY, [])
    if not dists:
        return None
    if len(dists) > 2:
        raise FirescaleError(f"{source}: {len(dists)} dist blocks; give one for training and at most one for testing")
    names = ("dist (train)", "dist (test)")
    for k, d in enumerate(dists):
        if not isinstance(d, dict):
            raise FirescaleError(f"{source}: {names[k]} must be a block 'dist {{ arch {{ ... }} }}', not {d!r}")
    arches = [_arches(_fields(d), f"{source}: {names[k]}") for k, d in enumerate(dists)]
    return DevicePlan(arches[0], arches[1] if len(arches) > 1 else (), source)


def plan_from_mapping(value: Any, source: str) -> DevicePlan:
    """The YAML form: `dist: {train: [[{name: conv1, device: 0}, ...], ...], test: [...]}`."""
    if not isinstance(value, dict) or "train" not in value or set(value) - {"train", "test"}:
        raise FirescaleError(f"{source}: key 'dist' must map 'train' (and optionally 'test') to lists of arches")
    out = []
    for which in ("train", "test"):
        arches = value.get(which) or []
        if not isinstance(arches, list) or (which == "train" and not arches):
            raise FirescaleError(f"{source}: key 'dist.{which}' must be a list of arches, each a list of "
                                 "{name: LAYER, device: N}")
        parsed = []
        for k, arch in enumerate(arches):
            where = f"{source}: dist.{which}[{k}]"
            if not isinstance(arch, list) or not arch:
                raise FirescaleError(f"{where}: an arch is a non-empty list of {{name: LAYER, device: N}}")
            items = [list(a.items()) if isinstance(a, dict) else a for a in arch]
            parsed.append(tuple(_assign(a, where) for a in items))
        out.append(tuple(parsed))
    return DevicePlan(out[0], out[1], source)


def read_layer_plan(path: str | Path) -> DevicePlan | None:
    """The layer plan in a solver file (prototxt `dist` blocks or a YAML `dist` key), or None."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FirescaleError(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml", ".json"):
        raw = parse_yaml(text, path) or {}
        return plan_from_mapping(raw[PLAN_KEY], str(path)) if isinstance(raw, dict) and PLAN_KEY in raw else None
    return plan_from_prototxt(text, str(path))


# ---------------------------------------------------------------- checking and expanding


def arch_devices(arch: Sequence[LayerAssign], spec: NetSpec, where: str) -> list[int]:
    """The device of every top-level layer of `spec`; layers before the first assignment run on device 0."""
    names = [layer.name for layer in spec.layers]
    branches = {f"{layer.name}/{name}": layer for layer in spec.layers if isinstance(layer, Inception)
                for name in _branch_names(layer)}
    starts: dict[int, int] = {}
    last = -1
    for assign in arch:
        if assign.name not in names:
            if assign.name in branches:
                block = branches[assign.name]
                what = "inception" if block.merge == "concat" else f"block (Eltwise {block.merge.upper()})"
                raise FirescaleError(f"{where}: layer_assign names {assign.name!r}, a branch inside {what} "
                                     f"{block.name!r} of net {spec.name!r}; assign the whole module")
            raise FirescaleError(f"{where}: layer_assign names layer {assign.name!r}, which net {spec.name!r} "
                                 f"does not have (its layers: {', '.join(names)})")
        index = names.index(assign.name)
        if index <= last:
            raise FirescaleError(f"{where}: layer_assign {assign.name!r} comes after {names[last]!r}, which runs "
                                 f"later in net {spec.name!r}; list the layers where the device changes in order")
        starts[index], last = assign.device, index
    devices, current = [], 0
    for i in range(len(names)):
        current = starts.get(i, current)
        devices.append(current)
    return devices


def _branch_names(layer: Inception) -> list[str]:
    return [sub.name for branch in layer.branches for sub in branch]


def check_devices(plan: DevicePlan, available: int, what: str) -> None:
    """Refuse a plan that names a device beyond the `available` ones of `what` (one sentence)."""
    for which, arches in (("train", plan.train), ("test", plan.test)):
        for k, arch in enumerate(arches):
            for assign in arch:
                if assign.device >= available:
                    raise FirescaleError(
                        f"{plan.source}: dist ({which}) arch {k}: layer_assign {assign.name!r} puts it on device "
                        f"{assign.device}, but {what} has {available} device(s), numbered 0 to {available - 1}")


def record_devices(spec: NetSpec, top_devices: Sequence[int]) -> list[int]:
    """Expand a device per top-level layer to one per layer record (inception branches share their module's)."""
    out: list[int] = []
    for layer, device in zip(spec.layers, top_devices):
        out += [device] * _record_count(layer)
    return out


def _record_count(layer: Layer) -> int:
    if isinstance(layer, Inception):
        return 1 + sum(_record_count(sub) for branch in layer.branches for sub in branch)
    return 1


def dist_prototxt(spec: NetSpec, top_devices: Sequence[int]) -> str:
    """The seed's solver block for one arch: a layer_assign where the device changes (and at the start)."""
    lines = ["dist {", "  arch {"]
    previous = None
    for layer, device in zip(spec.layers, top_devices):
        if device != previous:
            lines.append(f"    layer_assign {{ name: \"{layer.name}\" device: {device} }}")
            previous = device
    return "\n".join(lines + ["  }", "}"]) + "\n"
