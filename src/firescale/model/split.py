"""Splitting a net's layers over devices: plans balanced for memory or time, checks, and the split's iteration time."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from firescale.errors import FirescaleError
from firescale.model.memory import DevicePeak, NetMemory, device_peaks
from firescale.nets.device_plan import dist_prototxt, record_devices
from firescale.nets.spec import NetSpec

if TYPE_CHECKING:  # annotations only: paleo is imported where the time is computed
    from firescale.model.paleo import Platform


@dataclass(frozen=True)
class LayerSplit:
    """Contiguous blocks of top-level layers, one per device, and each device's memory peak."""

    net: NetSpec
    devices: tuple[int, ...]           # the device of each top-level layer
    peaks: tuple[DevicePeak, ...]
    limits: tuple[float, ...]

    @property
    def fits(self) -> bool:
        return all(p.bytes <= limit for p, limit in zip(self.peaks, self.limits))

    def blocks(self) -> list[tuple[int, str, str]]:
        """(device, first layer, last layer) of each block."""
        names = [layer.name for layer in self.net.layers]
        out: list[tuple[int, str, str]] = []
        for name, device in zip(names, self.devices):
            if out and out[-1][0] == device:
                out[-1] = (device, out[-1][1], name)
            else:
                out.append((device, name, name))
        return out

    def describe(self) -> str:
        """'conv1_1..conv4_2 on device 0 (5.21 GB), conv4_3..loss on device 1 (4.02 GB)'."""
        peaks = {p.device: p.bytes for p in self.peaks}
        return ", ".join(f"{first}..{last} on device {d} ({peaks[d] / 1e9:.2f} GB)" if first != last
                         else f"{first} on device {d} ({peaks[d] / 1e9:.2f} GB)" for d, first, last in self.blocks())

    def dist(self) -> str:
        return dist_prototxt(self.net, self.devices)


def plan_peaks(memory: NetMemory, spec: NetSpec, top_devices: Sequence[int]) -> list[DevicePeak]:
    """Per-device peaks of a placement given per top-level layer."""
    return device_peaks(memory, record_devices(spec, top_devices))


def _block_peak(memory: NetMemory, spec: NetSpec, start: int, end: int) -> int:
    """Peak of a device holding top-level layers [start, end), with copies from and to its neighbours."""
    top = [0] * start + [1] * (end - start) + [2] * (len(spec.layers) - end)
    return plan_peaks(memory, spec, top)[1].bytes


def _last_end(fits: Callable[[int], bool], start: int, count: int) -> int:
    """The largest end in (start, count] with fits(end) (assumed monotone), or start when none fits."""
    lo, hi = start, count
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fits_from(fits: Callable[[int, int, int], bool], device: int, start: int, end: int) -> bool:
    return fits(device, start, end)


def _greedy(count: int, devices: int, fits: Callable[[int, int, int], bool]) -> list[int] | None:
    """Fill devices in order with contiguous blocks as long as `fits(device, start, end)`; None if layers remain."""
    out: list[int] = []
    start = 0
    for d in range(devices):
        end = _last_end(partial(_fits_from, fits, d, start), start, count)
        out += [d] * (end - start)
        start = end
        if start == count:
            return out
    return None


def _bisect(lo: float, hi: float, plan_at: Callable[[float], list[int] | None]) -> list[int] | None:
    best = plan_at(hi)
    if best is None:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        found = plan_at(mid)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return best


def plan_for_memory(memory: NetMemory, spec: NetSpec, limits: Sequence[float]) -> LayerSplit:
    """Contiguous blocks over `len(limits)` devices (bytes each, they may differ) that minimise the
    largest peak / limit; `fits` on the result says whether every device stays within its limit."""
    count = len(spec.layers)
    whole = plan_peaks(memory, spec, [0] * count)[0].bytes

    def plan_at(u: float) -> list[int] | None:
        return _greedy(count, len(limits), lambda d, s, e: _block_peak(memory, spec, s, e) <= u * limits[d])

    top = _bisect(0.0, max(1.0, 2.0 * whole / min(limits)), plan_at) or [0] * count
    return LayerSplit(spec, tuple(top), tuple(plan_peaks(memory, spec, top)), tuple(limits))


def plan_for_time(memory: NetMemory, spec: NetSpec, limits: Sequence[float],
                  layer_seconds: Sequence[float]) -> LayerSplit:
    """Contiguous blocks whose largest compute time (forward and backward, per top-level layer) is the
    smallest, each device within its memory limit."""
    count = len(spec.layers)
    total = sum(layer_seconds)

    def plan_at(t: float) -> list[int] | None:
        return _greedy(count, len(limits), lambda d, s, e: sum(layer_seconds[s:e]) <= t
                       and _block_peak(memory, spec, s, e) <= limits[d])

    top = _bisect(0.0, total * 1.000001 + 1e-12, plan_at)
    if top is None:
        raise FirescaleError(f"net {spec.name!r} at batch {memory.batch} does not fit in {len(limits)} device(s) "
                             f"of {', '.join(f'{l / 1e9:.2f}' for l in limits)} GB, whatever the split")
    return LayerSplit(spec, tuple(top), tuple(plan_peaks(memory, spec, top)), tuple(limits))


def propose_split(memory: NetMemory, spec: NetSpec, limit: float, max_devices: int = 16) -> LayerSplit | None:
    """The split over the fewest devices of `limit` bytes each (2 to max_devices) that fits, or None."""
    for k in range(2, max_devices + 1):
        plan = plan_for_memory(memory, spec, [limit] * k)
        if plan.fits:
            return plan
    return None


def largest_batch_that_fits(spec: NetSpec, limit: float, make: Callable[[int], NetMemory], upto: int) -> int:
    """The largest batch (1..upto) whose peak on one device stays within `limit`; 0 when none does."""
    lo, hi = 0, upto
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if make(mid).peak <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_plan_memory(memory: NetMemory, spec: NetSpec, top_devices: Sequence[int], limits: Sequence[float],
                      where: str) -> list[DevicePeak]:
    """Per-device peaks of a given plan; refuses one that leaves a device over its limit, naming the
    device, its bytes and the layer where it peaks."""
    peaks = plan_peaks(memory, spec, top_devices)
    for peak in peaks:
        limit = limits[peak.device] if peak.device < len(limits) else limits[-1]
        if peak.bytes > limit:
            raise FirescaleError(f"{where} leaves device {peak.device} over its memory: {peak.bytes:,} bytes "
                                 f"({peak.bytes / 1e9:.2f} GB) at layer {peak.at}, where {limit / 1e9:.2f} GB "
                                 f"({int(limit):,} bytes) is the limit; move layers off device {peak.device}")
    return peaks


@dataclass(frozen=True)
class SplitTime:
    """A split's iteration as the seed's Caffe runs it: each device computes its layers in turn (forward,
    then backward in reverse, then its update) and every boundary copies activations and gradients once."""

    device_compute_s: tuple[float, ...]
    copies: tuple[tuple[str, int, float], ...]   # (after layer, bytes of one copy, seconds of both)
    overhead_s: float = 0.0

    @property
    def copy_s(self) -> float:
        return sum(c[2] for c in self.copies)

    @property
    def iteration_s(self) -> float:
        return sum(self.device_compute_s) + self.copy_s + self.overhead_s


def split_iteration_time(platform: Platform, spec: NetSpec, batch: int, top_devices: Sequence[int],
                         copy_bandwidth: float, copy_latency: float = 0.0) -> SplitTime:
    """Compute per device (Paleo's per-layer times on the platform's device) plus the boundary copies,
    each `copy_latency + bytes / copy_bandwidth`, forward and backward."""
    from firescale.model.layers import BYTES_PER_FLOAT, net_cost
    from firescale.model.paleo import compute_times

    cost = net_cost(spec, batch)
    times = compute_times(cost, platform.device, elementwise=platform.elementwise, profile=platform.profile)
    devices = record_devices(spec, top_devices)
    compute = [0.0] * (max(top_devices) + 1)
    for layer, d, fwd, bwd in zip(cost.layers, devices, times.layer_forward, times.layer_backward):
        compute[d] += fwd + bwd + times.update * layer.params / max(cost.params, 1)
    copies = []
    for i in range(1, len(spec.layers)):
        if top_devices[i] != top_devices[i - 1]:
            before = spec.layers[i - 1].name
            h, w, c = next(l.output_shape for l in cost.layers if l.name == before)
            nbytes = h * w * c * batch * BYTES_PER_FLOAT
            copies.append((before, nbytes, 2 * (copy_latency + nbytes / copy_bandwidth)))
    return SplitTime(tuple(compute), tuple(copies), platform.overhead_s)


def per_top_layer(spec: NetSpec, per_record: Sequence[float]) -> list[float]:
    """Values per layer record (inception branches flattened) summed per top-level layer."""
    out = [0.0] * len(spec.layers)
    for i, value in zip(record_devices(spec, list(range(len(spec.layers)))), per_record):
        out[i] += value
    return out
