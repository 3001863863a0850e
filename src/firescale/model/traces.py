"""Layer-wise traces in the DAG paper's format (Table VI): read, write and replay (train/profile.py measures them)."""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_text
from firescale.errors import FirescaleError
from firescale.model.comm import Link, allreduce_time
from firescale.model.dag import Schedule, wait_free_schedule

TRACE_COLUMNS = ("layer_id", "name", "forward_us", "backward_us", "comm_us", "gradient_bytes")
# Rows that are not layers.  `data` (the DAG paper's layer 0) holds the I/O task in its forward time: the
# time to read a batch, which the overlapped schedule hides behind computation.  `data_wait` holds what a
# trainer measured waiting for its batch (`train --profile-layers`): I/O already exposed, never hidden again.
DATA_LAYER, DATA_WAIT_LAYER = "data", "data_wait"


@dataclass(frozen=True)
class LayerTrace:
    """One layer of one iteration: times in microseconds, gradient size in bytes (Table VI).  The one record of
    a layer's measured times: every backend's `profile_layers` gives a list of them, and a layer profile's rows
    (model/profile.py) are built from them."""

    layer_id: int
    name: str
    forward_us: float
    backward_us: float
    comm_us: float
    gradient_bytes: int

    @property
    def forward_s(self) -> float:
        return self.forward_us / 1e6

    @property
    def backward_s(self) -> float:
        return self.backward_us / 1e6


def _record(raw: dict[str, Any], where: str) -> LayerTrace:
    missing = [c for c in TRACE_COLUMNS if c not in raw or raw[c] in ("", None)]
    if missing:
        raise FirescaleError(f"{where}: missing {', '.join(missing)}; a trace record needs "
                             f"{', '.join(TRACE_COLUMNS)}")
    try:
        rec = LayerTrace(int(raw["layer_id"]), str(raw["name"]), float(raw["forward_us"]),
                         float(raw["backward_us"]), float(raw["comm_us"]), int(float(raw["gradient_bytes"])))
    except (TypeError, ValueError) as exc:
        raise FirescaleError(f"{where}: {exc}; times must be numbers (µs) and gradient_bytes an integer") from None
    if min(rec.forward_us, rec.backward_us, rec.comm_us, rec.gradient_bytes) < 0:
        raise FirescaleError(f"{where}: times and gradient_bytes must not be negative")
    return rec


def read_trace(path: str | Path) -> list[LayerTrace]:
    """A trace from a .csv (header row of TRACE_COLUMNS) or .json (a list of records) file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise FirescaleError(f"cannot read trace {path}: {exc.strerror}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FirescaleError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
        rows = data.get("layers") if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise FirescaleError(f"{path}: expected a list of layer records or {{\"layers\": [...]}}")
        records = [_record(r if isinstance(r, dict) else {}, f"{path} record {i}") for i, r in enumerate(rows)]
    else:
        reader = csv.DictReader(io.StringIO(text))
        records = [_record(r, f"{path} line {i + 2}") for i, r in enumerate(reader)]
    if not records:
        raise FirescaleError(f"{path}: the trace has no layer records")
    return records


def format_trace_csv(trace: Sequence[LayerTrace]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TRACE_COLUMNS)
    for r in trace:
        writer.writerow([r.layer_id, r.name, f"{r.forward_us:.6g}", f"{r.backward_us:.6g}",
                         f"{r.comm_us:.6g}", r.gradient_bytes])
    return out.getvalue()


def write_trace(path: str | Path, trace: Sequence[LayerTrace]) -> Path:
    """Write a trace atomically; .json gives {"layers": [...]}, anything else CSV."""
    path = Path(path)
    if path.suffix == ".json":
        atomic_write_text(path, json.dumps({"columns": list(TRACE_COLUMNS),
                                            "layers": [asdict(r) for r in trace]}, indent=1) + "\n")
    else:
        atomic_write_text(path, format_trace_csv(trace))
    return path


def retarget_comm(trace: Sequence[LayerTrace], algorithm: str, gpus: int, link: Link) -> list[LayerTrace]:
    """The same trace with each layer's communication time modelled for `gpus` ranks on `link`."""
    return [replace(r, comm_us=allreduce_time(algorithm, r.gradient_bytes, gpus, link) * 1e6
                    if r.gradient_bytes else 0.0) for r in trace]


def replay_trace(trace: Sequence[LayerTrace], *, overlap: bool = True, io_us: float = 0.0,
                 h2d_us: float = 0.0, update_us: float = 0.0) -> Schedule:
    """Replay a trace through the DAG model; returns the schedule in microseconds.

    With `overlap` the schedule is wait-free backprop with I/O beside the computation (Eq. 4-5);
    without it, naive S-SGD with everything in series (Eq. 2).  A `data` row's forward time is added
    to the I/O task; a `data_wait` row's is an exposed wait, in series in both schedules.
    """
    data_io = sum(r.forward_us for r in trace if r.name == DATA_LAYER)
    data_wait = sum(r.forward_us for r in trace if r.name == DATA_WAIT_LAYER)
    layers = [r for r in trace if r.name not in (DATA_LAYER, DATA_WAIT_LAYER)]
    return wait_free_schedule([r.forward_us for r in layers], [r.backward_us for r in layers],
                              [r.comm_us for r in layers], update=update_us, io=io_us + data_io, h2d=h2d_us,
                              data_wait=data_wait, overlap=overlap, overlap_io=overlap)


def trace_totals(trace: Sequence[LayerTrace]) -> dict[str, float]:
    return {f.name: sum(getattr(r, f.name) for r in trace)
            for f in fields(LayerTrace) if f.name in ("forward_us", "backward_us", "comm_us", "gradient_bytes")}
