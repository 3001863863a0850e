"""Layer profiles, as Paleo profiles layers: each layer's forward and backward time measured on one device in one
precision, inside real training iterations (`firescale bench layers`).  The model takes a layer's time from a
profile where it holds the layer's shape (`measured`); else from the efficiency its family of layers reached in
the profile, a fraction of the device's roofline (`fitted FAMILY`, then `fitted KIND`); else from the FLOPs and
bytes at the device's peak and percent of peak (`peak`), as without a profile."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json, load_json
from firescale.errors import FirescaleError
from firescale.model.layers import LayerCost, NetCost
from firescale.model.traces import LayerTrace

PROFILE_FORMAT = "firescale.layer_profile/1"
MEASURED, PEAK = "measured", "peak"


@dataclass(frozen=True)
class ProfiledLayer:
    """One layer of one net at one batch: its measured seconds per pass, and the counts the fits divide by.

    The times are those of the layer's row in a trace (model/traces.py's LayerTrace, the one record a backend's
    `profile_layers` gives), joined here with the model's counts of the layer; a profile file keeps them in
    seconds, as it always has."""

    net: str
    name: str
    kind: str
    family: str
    batch: int
    input_shape: tuple[int, int, int]
    output_shape: tuple[int, int, int]
    params: int
    forward_s: float
    backward_s: float
    forward_flops: float
    backward_flops: float
    forward_bytes: float
    backward_bytes: float

    @property
    def signature(self) -> tuple[object, ...]:
        return (self.family or self.kind, self.batch, self.input_shape, self.output_shape, self.params)

    @classmethod
    def of(cls, net: str, cost: LayerCost, timing: LayerTrace) -> ProfiledLayer:
        """The layer `cost` of `net` with the times of its trace row `timing`."""
        return cls(net, cost.name, cost.kind, cost.family or cost.kind, cost.batch, cost.input_shape,
                   cost.output_shape, cost.params, timing.forward_s, timing.backward_s, cost.forward_flops,
                   cost.backward_flops, cost.forward_memory_bytes, cost.backward_memory_bytes)


@dataclass(frozen=True)
class ProfiledIteration:
    """A whole training iteration of the same net and batch, timed beside its layers: what they add up to."""

    net: str
    batch: int
    iteration_s: float
    layers_s: float          # the sum of its layers' forward and backward seconds
    update_s: float          # the solver's update, timed on its own
    params: int              # the parameters it updates
    peak_memory_bytes: int = 0


@dataclass(frozen=True)
class LayerProfile:
    """Layer times of one device in one precision, with what measured them (framework, versions, commit)."""

    device: str
    precision: str
    framework: str
    layers: tuple[ProfiledLayer, ...]
    iterations: tuple[ProfiledIteration, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)
    commit: str = ""
    source: str = "layer profile"

    def nets(self) -> list[str]:
        return sorted({layer.net for layer in self.layers})

    def without(self, net: str) -> LayerProfile:
        """This profile less one net's layers and iterations (leave one out)."""
        return replace(self, layers=tuple(lay for lay in self.layers if lay.net != net),
                       iterations=tuple(it for it in self.iterations if it.net != net))

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, **{k: v for k, v in asdict(self).items() if k != "source"}}


@dataclass(frozen=True)
class LayerTime:
    """A layer's predicted seconds per pass and where they came from (`measured`, `fitted FAMILY`, `peak`)."""

    forward_s: float
    backward_s: float
    source: str


# ---------------------------------------------------------------- reading and writing

def _shape(value: Any, where: str) -> tuple[int, int, int]:
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) and v > 0 for v in value)):
        raise FirescaleError(f"{where} must be a shape [H, W, C] of three positive integers, not {value!r}")
    return (value[0], value[1], value[2])


def _number(raw: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        need = "a positive number" if positive else "a number >= 0"
        raise FirescaleError(f"{where}: key {key!r} must be {need}, not {value!r}")
    return float(value)


def _text(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise FirescaleError(f"{where}: key {key!r} must be a non-empty string, not {value!r}")
    return value


def _layer(raw: Any, where: str) -> ProfiledLayer:
    if not isinstance(raw, dict):
        raise FirescaleError(f"{where} must be an object, not {raw!r}")
    return ProfiledLayer(
        _text(raw, "net", where), _text(raw, "name", where), _text(raw, "kind", where), _text(raw, "family", where),
        int(_number(raw, "batch", where, positive=True)), _shape(raw.get("input_shape"), f"{where}.input_shape"),
        _shape(raw.get("output_shape"), f"{where}.output_shape"), int(_number(raw, "params", where)),
        *(_number(raw, k, where) for k in ("forward_s", "backward_s", "forward_flops", "backward_flops",
                                           "forward_bytes", "backward_bytes")))


def _iteration(raw: Any, where: str) -> ProfiledIteration:
    if not isinstance(raw, dict):
        raise FirescaleError(f"{where} must be an object, not {raw!r}")
    return ProfiledIteration(_text(raw, "net", where), int(_number(raw, "batch", where, positive=True)),
                             _number(raw, "iteration_s", where, positive=True), _number(raw, "layers_s", where),
                             _number(raw, "update_s", where), int(_number(raw, "params", where)),
                             int(_number(raw, "peak_memory_bytes", where)))


def profile_from_dict(data: Any, source: str) -> LayerProfile:
    """A profile from its JSON form; any problem is one sentence naming `source` and the record."""
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise FirescaleError(f"{source} is not a layer profile: expected an object with \"format\": "
                             f"\"{PROFILE_FORMAT}\" (written by `firescale bench layers`)")
    layers, iterations = data.get("layers"), data.get("iterations", [])
    if not isinstance(layers, list) or not layers:
        raise FirescaleError(f"{source}: key 'layers' must be a non-empty list of profiled layers")
    if not isinstance(iterations, list):
        raise FirescaleError(f"{source}: key 'iterations' must be a list")
    versions = data.get("versions", {})
    if not isinstance(versions, dict):
        raise FirescaleError(f"{source}: key 'versions' must be an object")
    return LayerProfile(_text(data, "device", source), _text(data, "precision", source),
                        _text(data, "framework", source),
                        tuple(_layer(r, f"{source}: layers[{i}]") for i, r in enumerate(layers)),
                        tuple(_iteration(r, f"{source}: iterations[{i}]") for i, r in enumerate(iterations)),
                        {str(k): str(v) for k, v in versions.items()}, str(data.get("commit") or ""), source)


def read_profile(path: str | Path) -> LayerProfile:
    return profile_from_dict(load_json(path, "layer profile"), str(path))


def write_profile(path: str | Path, profile: LayerProfile) -> Path:
    return atomic_write_json(path, profile.to_dict())


def merge_profiles(profiles: Iterable[LayerProfile], source: str = "layer profile") -> LayerProfile:
    """Profiles of one device and precision as one (later measurements of a layer shape after earlier ones)."""
    profiles = list(profiles)
    if not profiles:
        raise FirescaleError("no layer profiles to merge")
    first = profiles[0]
    for other in profiles[1:]:
        if (other.device, other.precision) != (first.device, first.precision):
            raise FirescaleError(f"{other.source}: measured on {other.device} in {other.precision}, but "
                                 f"{first.source} on {first.device} in {first.precision}; a profile holds one "
                                 "device and one precision")
    return replace(first, layers=tuple(lay for p in profiles for lay in p.layers),
                   iterations=tuple(it for p in profiles for it in p.iterations), source=source)


# ---------------------------------------------------------------- the model's use of a profile

def roofline_s(flops: float, memory_bytes: float, peak_flops: float, memory_bandwidth: float) -> float:
    """Paleo's C(f, d) at 100% of peak: FLOPs over the peak plus bytes over the memory bandwidth."""
    return flops / peak_flops + memory_bytes / memory_bandwidth


@dataclass(frozen=True)
class Efficiencies:
    """Per family (and per kind), the roofline's seconds over the measured ones, forward and backward: the
    fraction of the device's peak those layers ran at in the profile."""

    family: dict[str, tuple[float, float]]
    kind: dict[str, tuple[float, float]]


def fit_efficiencies(profile: LayerProfile, peak_flops: float, memory_bandwidth: float) -> Efficiencies:
    """Each family's efficiency: the sum of its layers' roofline seconds over the sum of their measured ones
    (so the layers that take the time weigh the most), for each pass with time measured."""
    def fit(key: str) -> dict[str, tuple[float, float]]:
        sums: dict[str, list[float]] = {}
        for lay in profile.layers:
            s = sums.setdefault(getattr(lay, key), [0.0, 0.0, 0.0, 0.0])
            s[0] += roofline_s(lay.forward_flops, lay.forward_bytes, peak_flops, memory_bandwidth)
            s[1] += lay.forward_s
            if lay.backward_flops > 0:
                s[2] += roofline_s(lay.backward_flops, lay.backward_bytes, peak_flops, memory_bandwidth)
                s[3] += lay.backward_s
        return {name: (s[0] / s[1] if s[1] > 0 else 0.0, s[2] / s[3] if s[3] > 0 else 0.0)
                for name, s in sums.items()}
    return Efficiencies(fit("family"), fit("kind"))


def layer_times(cost: NetCost, profile: LayerProfile, peak_flops: float, memory_bandwidth: float,
                ppp: float) -> list[LayerTime]:
    """Each layer's seconds per pass: measured where the profile has its signature (the mean of its
    measurements), else at its family's (then its kind's) fitted efficiency, else at `ppp` of the peak."""
    measured: dict[tuple[object, ...], list[ProfiledLayer]] = {}
    for lay in profile.layers:
        measured.setdefault(lay.signature, []).append(lay)
    fits = fit_efficiencies(profile, peak_flops, memory_bandwidth)
    out = []
    for layer in cost.layers:
        ideal_fwd = roofline_s(layer.forward_flops, layer.forward_memory_bytes, peak_flops, memory_bandwidth)
        ideal_bwd = roofline_s(layer.backward_flops, layer.backward_memory_bytes, peak_flops, memory_bandwidth) \
            if layer.backward_flops > 0 else 0.0
        if hits := measured.get(layer.signature):
            out.append(LayerTime(sum(h.forward_s for h in hits) / len(hits),
                                 sum(h.backward_s for h in hits) / len(hits) if ideal_bwd else 0.0, MEASURED))
            continue
        family = layer.family or layer.kind
        for name, table in ((family, fits.family), (layer.kind, fits.kind)):
            fwd_eff, bwd_eff = table.get(name, (0.0, 0.0))
            if fwd_eff > 0 and (bwd_eff > 0 or not ideal_bwd):
                out.append(LayerTime(ideal_fwd / fwd_eff, ideal_bwd / bwd_eff if ideal_bwd else 0.0,
                                     f"fitted {name}"))
                break
        else:
            out.append(LayerTime(ideal_fwd / ppp, ideal_bwd / ppp, PEAK))
    return out


def update_time(params: int, weight_bytes: int, profile: LayerProfile, peak_flops: float, memory_bandwidth: float,
                ppp: float) -> tuple[float, str]:
    """The update's seconds (w -= lr * dw: 2 FLOPs a parameter, weights and gradients read, weights written) at
    the efficiency the profile's updates reached, else at `ppp` of the peak; and where the figure came from."""
    ideal = roofline_s(2.0 * params, 3.0 * weight_bytes, peak_flops, memory_bandwidth)
    timed = [(roofline_s(2.0 * it.params, 12.0 * it.params, peak_flops, memory_bandwidth), it.update_s)
             for it in profile.iterations if it.update_s > 0 and it.params > 0]
    if not timed:
        return ideal / ppp, PEAK
    efficiency = sum(r for r, _ in timed) / sum(t for _, t in timed)
    return ideal / efficiency, "fitted update"
