"""Layer-to-device plans (Oh and Lee's `dist { arch { layer_assign } }`) against a net: where each layer
runs, checked, expanded and written back.  The plan is read with its solver file (firescale.caffe.dist)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from firescale.caffe.dist import DevicePlan, LayerAssign, plan_from_value
from firescale.caffe.prototxt import PLAN_KEY
from firescale.caffe.solver import read_solver_keys
from firescale.errors import FirescaleError
from firescale.nets.spec import Inception, Layer, NetSpec


def read_layer_plan(path: str | Path) -> DevicePlan | None:
    """The layer plan in a file read as a solver file is (prototxt `dist` blocks or a YAML `dist` key), or None.
    A solver's own plan comes with it: `load_solver(path).dist`."""
    raw = read_solver_keys(path, "layer plan")
    return plan_from_value(raw[PLAN_KEY], str(path)) if PLAN_KEY in raw else None


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
