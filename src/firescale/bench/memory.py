"""The memory model beside what TensorFlow allocated for the same iteration, per layer: records and table."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from firescale.errors import FirescaleError
from firescale.model.memory import NetMemory, device_peaks

MEASURED_FORMAT = "firescale.memory.measured/1"
PASSES = ("forward", "backward", "update")


@dataclass
class MeasuredLayer:
    """Bytes TensorFlow's allocator handed out to one layer's kernels in each pass, and its variables."""

    name: str
    forward: int = 0
    backward: int = 0
    update: int = 0
    weights: int = 0
    history: int = 0


@dataclass
class MeasuredMemory:
    """One measured iteration: per-layer allocations, the unattributed rest, and the allocator's peaks.

    `grad_peak` and `update_peak` are the most bytes of tensors alive at once during the forward/backward
    run and the update run, beyond what each run started with (the variables, the fed batch or gradients).
    """

    net: str
    batch: int
    solver_type: str
    layers: list[MeasuredLayer]
    other: dict[str, int] = field(default_factory=dict)
    grad_peak: int = 0
    update_peak: int = 0
    inputs: int = 0            # the fed batch (images and labels)

    def layer(self, name: str) -> MeasuredLayer:
        return next(m for m in self.layers if m.name == name)

    @property
    def variables(self) -> int:
        """Weights and solver history: the variables' tensors."""
        return sum(m.weights + m.history for m in self.layers)

    @property
    def training_peak(self) -> int:
        """The most bytes in use during the forward and backward passes (variables and batch included)."""
        return self.variables + self.inputs + self.grad_peak

    @property
    def peak(self) -> int:
        """The most bytes in use: the variables and the batch under the forward/backward run's peak, or
        the variables and the gradients (fed to the update as the trainer hands them) under the update's."""
        gradients = sum(m.weights for m in self.layers)
        return max(self.variables + self.inputs + self.grad_peak, self.variables + gradients + self.update_peak)

    def to_dict(self) -> dict[str, Any]:
        return {"format": MEASURED_FORMAT, **asdict(self), "peak": self.peak}


def measured_from_dict(data: dict[str, Any], where: str) -> MeasuredMemory:
    """A MeasuredMemory written by `to_dict`; errors name the file."""
    if not isinstance(data, dict) or data.get("format") != MEASURED_FORMAT:
        raise FirescaleError(f"{where}: not a {MEASURED_FORMAT} record")
    fields = {k: v for k, v in data.items() if k not in ("format", "peak", "layers")}
    return MeasuredMemory(layers=[MeasuredLayer(**m) for m in data["layers"]], **fields)


@dataclass(frozen=True)
class ComparedRow:
    """One layer (with the in-place ReLUs after it, which TensorFlow fuses into it): model and measured bytes."""

    name: str
    model: dict[str, int]
    measured: dict[str, int]


def _groups(memory: NetMemory) -> list[list[int]]:
    """Indices of each layer and the ReLU layers right after it (TensorFlow fuses them into the layer)."""
    groups: list[list[int]] = []
    for i, layer in enumerate(memory.layers):
        if layer.kind == "relu" and groups:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def compare(model: NetMemory, measured: MeasuredMemory) -> list[ComparedRow]:
    """Per layer group: forward, backward and update allocations and resident bytes, model beside measured."""
    if model.names != [m.name for m in measured.layers]:
        raise FirescaleError(f"the measurement of net {measured.net!r} does not have the model's layers")
    rows = []
    for group in _groups(model):
        mine = [model.layers[i] for i in group]
        theirs = [measured.layers[i] for i in group]
        keys = (*PASSES, "resident")
        rows.append(ComparedRow(
            mine[0].name if len(mine) == 1 else f"{mine[0].name} (+{', '.join(l.name for l in mine[1:])})",
            {k: sum(getattr(l, k) for l in mine) for k in keys},
            {k: sum((m.weights + m.history) if k == "resident" else getattr(m, k) for m in theirs) for k in keys}))
    return rows


def _mb(value: int) -> str:
    return f"{value / 1e6:.3f}"


def _ratio(model: int, measured: int) -> str:
    if measured == 0:
        return "—" if model == 0 else "∞"
    return f"{model / measured:.3f}"


def comparison_markdown(model: NetMemory, measured: MeasuredMemory) -> str:
    """The per-layer table (MB, model / measured) with the totals and peaks under it."""
    lines = [f"Memory of one training iteration: {model.net}, batch {model.batch}, {model.solver_type}, "
             f"{model.device_kind} (MB; model / TensorFlow's allocations)", "",
             "| layer | forward | backward | update | weights + history |", "|---|---:|---:|---:|---:|"]
    rows = compare(model, measured)
    for row in rows:
        cells = [f"{_mb(row.model[k])} / {_mb(row.measured[k])}" for k in (*PASSES, "resident")]
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    totals = {k: (sum(r.model[k] for r in rows), sum(r.measured[k] for r in rows)) for k in (*PASSES, "resident")}
    total_cells = " | ".join(f"{_mb(a)} / {_mb(b)} ({_ratio(a, b)})" for a, b in totals.values())
    lines.append(f"| **total** | {total_cells} |")
    other = sum(measured.other.values())
    training = device_peaks(model, [0] * len(model.layers))[0].training_bytes
    lines += ["", f"Peak in use during forward and backward: model {_mb(training)} MB, measured "
                  f"{_mb(measured.training_peak)} MB (ratio {_ratio(training, measured.training_peak)}); over the "
                  f"whole iteration, update included: model {_mb(model.peak)} MB, measured {_mb(measured.peak)} MB "
                  f"(ratio {_ratio(model.peak, measured.peak)}); allocations outside any layer: {_mb(other)} MB."]
    return "\n".join(lines) + "\n"
