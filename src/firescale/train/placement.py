"""One replica's layers on several devices: which device each layer takes, and where the device changes.

The copy layer at each boundary and its measured cost are the TensorFlow backend's (train/tensorflow/placement.py)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from firescale.caffe.dist import DevicePlan, LayerAssign
from firescale.errors import FirescaleError
from firescale.nets.device_plan import arch_devices, check_devices
from firescale.nets.spec import NetSpec, infer_shapes


@dataclass(frozen=True)
class Boundary:
    """Where the device changes: the layer after which a copy moves the activations forward and the
    gradient back, the bytes of one copy, and the measured seconds of both copies in one iteration."""

    after: str
    source: str
    target: str
    bytes: int
    copy_s: float = 0.0


@dataclass(frozen=True)
class LayerPlacement:
    """The device of every top-level layer of one replica, as TensorFlow names them."""

    devices: tuple[str, ...]
    arch: int                       # which arch of the plan this replica follows
    boundaries: tuple[Boundary, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "arch": self.arch,
                "boundaries": [asdict(b) for b in self.boundaries],
                "copy_s": sum(b.copy_s for b in self.boundaries)}


def choose_arch(plan: DevicePlan, local_rank: int, local_size: int) -> int:
    """Replica k of a node follows arch k; a single arch serves every replica."""
    if plan.replicas == 1:
        return 0
    if plan.replicas != local_size:
        raise FirescaleError(f"{plan.source}: dist (train) gives {plan.replicas} arches but {local_size} ranks run "
                             f"on this node; give one arch, or one per rank of a node")
    return local_rank


def place(plan: DevicePlan, spec: NetSpec, arch_index: int, device_names: Sequence[str],
          arch: Sequence[LayerAssign] | None = None) -> LayerPlacement:
    """The placement of `spec`'s top-level layers for one arch on this replica's devices."""
    check_devices(plan, len(device_names), "this replica")
    chosen = plan.train[arch_index] if arch is None else arch
    top = arch_devices(chosen, spec, f"{plan.source}: dist arch {arch_index}")
    return LayerPlacement(tuple(device_names[d] for d in top), arch_index)


def with_boundaries(placement: LayerPlacement, spec: NetSpec, batch: int) -> LayerPlacement:
    """The placement with its boundaries: after which layer, between which devices, and how many bytes."""
    shapes = {rec.name: rec.output_shape for rec in infer_shapes(spec)}
    out = []
    for i in range(1, len(spec.layers)):
        a, b = placement.devices[i - 1], placement.devices[i]
        if a != b:
            h, w, c = shapes[spec.layers[i - 1].name]
            out.append(Boundary(spec.layers[i - 1].name, a, b, h * w * c * batch * 4))
    return LayerPlacement(placement.devices, placement.arch, tuple(out))
