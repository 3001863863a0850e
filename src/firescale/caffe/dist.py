"""Oh and Lee's layer-to-device plans as a solver file writes them (`dist { arch { layer_assign } }`, or a
YAML `dist` key): the plan's types and its reading.  Checking a plan against a net is firescale.nets.device_plan's."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from firescale.caffe.prototxt import PLAN_KEY, parse_prototxt
from firescale.errors import FirescaleError


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
    if not isinstance(fields, list) or not all(isinstance(f, tuple) and len(f) == 2 for f in fields):
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


def plan_from_blocks(dists: list[Any], source: str) -> DevicePlan | None:
    """The `dist` blocks of a Caffe solver.prototxt as caffe.prototxt reads them (the first for training, the
    second for testing); None when there are none."""
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


def plan_from_prototxt(text: str, source: str) -> DevicePlan | None:
    """The `dist` blocks of a solver.prototxt's text, or None."""
    return plan_from_blocks(parse_prototxt(text, source).get(PLAN_KEY, []), source)


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
            for j, a in enumerate(arch):
                if not isinstance(a, dict):
                    raise FirescaleError(f"{where}: item {j} is {a!r}; each item of an arch is a mapping "
                                         "{name: LAYER, device: N}")
            parsed.append(tuple(_assign(list(a.items()), where) for a in arch))
        out.append(tuple(parsed))
    return DevicePlan(out[0], out[1], source)


def plan_from_value(value: Any, source: str) -> DevicePlan | None:
    """The plan under a solver file's `dist` key: a list of blocks as Caffe's text format repeats them, or
    the YAML mapping of `train` and `test` arches."""
    if isinstance(value, dict):
        return plan_from_mapping(value, source)
    if isinstance(value, list):
        return plan_from_blocks(value, source)
    raise FirescaleError(f"{source}: key 'dist' must be dist {{ arch {{ ... }} }} blocks (.prototxt) or a mapping "
                         f"of 'train' and 'test' arches (YAML), not {value!r}")
