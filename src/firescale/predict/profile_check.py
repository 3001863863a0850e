"""How well a layer profile predicts: each profiled iteration predicted from the whole profile (the net's own
layers measured) and with its net left out (its layers fitted from the other nets' families), beside the whole
iteration measured with them (`firescale predict profile`)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from firescale.errors import FirescaleError
from firescale.model.layers import LayerCost, NetCost
from firescale.model.paleo import Device, compute_times
from firescale.model.profile import LayerProfile, ProfiledLayer


@dataclass(frozen=True)
class ProfileCheck:
    """One profiled iteration: measured, predicted with its own layers, and with its net left out."""

    net: str
    batch: int
    measured_s: float
    own_s: float
    left_out_s: float
    left_out_sources: dict[str, int]    # how many of its layers each source gave, left out

    @property
    def own_error_pct(self) -> float:
        return (self.own_s - self.measured_s) / self.measured_s * 100.0

    @property
    def left_out_error_pct(self) -> float:
        return (self.left_out_s - self.measured_s) / self.measured_s * 100.0


def _cost(layer: ProfiledLayer) -> LayerCost:
    """The layer as the model counts it, from the counts its profile entry keeps."""
    return LayerCost(layer.name, layer.kind, layer.input_shape, layer.output_shape, layer.batch, layer.params,
                     layer.forward_flops, layer.backward_flops, 0.0, layer.forward_bytes, layer.backward_bytes,
                     family=layer.family)


def profiled_cost(profile: LayerProfile, net: str, batch: int) -> NetCost:
    """A profiled net at a profiled batch, from its profile entries (the net's own file is not needed)."""
    layers = tuple(_cost(lay) for lay in profile.layers if lay.net == net and lay.batch == batch)
    if not layers:
        raise FirescaleError(f"{profile.source}: no layers of net {net!r} at batch {batch}")
    return NetCost(net, batch, layers)


def check_profile(profile: LayerProfile, device: Device) -> list[ProfileCheck]:
    """Every profiled iteration of `profile`, predicted on `device` with and without its own net's layers."""
    if not profile.iterations:
        raise FirescaleError(f"{profile.source}: no whole iterations were timed, so there is nothing to hold the "
                             "predictions against")
    rows = []
    for it in profile.iterations:
        cost = profiled_cost(profile, it.net, it.batch)
        own = compute_times(cost, device, profile=profile)
        left = compute_times(cost, device, profile=profile.without(it.net))
        rows.append(ProfileCheck(it.net, it.batch, it.iteration_s, own.compute, left.compute,
                                 dict(Counter(source.split()[0] for source in left.layer_sources))))
    return rows
