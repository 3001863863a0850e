"""Calibration as Paleo does it: fit compute and communication percent-of-peak from measurements."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_json
from ..errors import FirescaleError
from ..netspec import NetSpec, get_net
from .comm import fit_comm_ppp
from .layers import net_cost
from .paleo import Device, Platform, compute_times

CALIBRATION_FILE = "calibration.json"


@dataclass(frozen=True)
class Calibration:
    """Fitted percent-of-peak factors and the measurements they came from."""

    site: str
    ppp_compute: float
    ppp_comm: float
    compute_source: dict[str, Any]
    comm_source: dict[str, Any]

    def apply(self, platform: Platform) -> Platform:
        """The platform with these factors in place of its own."""
        return replace(platform, device=replace(platform.device, ppp=self.ppp_compute),
                       link=replace(platform.link, ppp=self.ppp_comm))


def fit_compute_ppp(net: NetSpec | str, batch: int, measured_iteration_s: float, device: Device,
                    *, elementwise: bool = True) -> float:
    """The compute percent of peak that makes one device's predicted iteration equal the measured one."""
    if measured_iteration_s <= 0:
        raise FirescaleError(f"the measured iteration time must be positive, not {measured_iteration_s}")
    spec = get_net(net) if isinstance(net, str) else net
    ideal = compute_times(net_cost(spec, batch), replace(device, ppp=1.0), elementwise=elementwise)
    ppp = ideal.compute / measured_iteration_s
    if ppp > 1.0:
        raise FirescaleError(f"device {device.name!r}: a measured iteration of {measured_iteration_s:.4g} s is "
                             f"faster than the peak allows ({ideal.compute:.4g} s); raise the site's "
                             f"device.peak_tflops or memory_bandwidth_gbs")
    return ppp


def calibrate(platform: Platform, net: NetSpec | str, batch: int, measured_iteration_s: float,
              allreduce: dict[str, Any] | None = None) -> Calibration:
    """Fit both factors.  `allreduce` is {"algorithm", "bytes", "ranks", "seconds"} from a benchmark;
    without it the communication factor stays at the platform's."""
    spec = get_net(net) if isinstance(net, str) else net
    ppp_compute = fit_compute_ppp(spec, batch, measured_iteration_s, platform.device,
                                  elementwise=platform.elementwise)
    compute_source = {"net": spec.name, "batch": batch, "measured_iteration_s": measured_iteration_s}
    ppp_comm, comm_source = platform.link.ppp, {"fitted": False}
    if allreduce is not None:
        try:
            algo, nbytes, ranks, seconds = (allreduce["algorithm"], float(allreduce["bytes"]),
                                            int(allreduce["ranks"]), float(allreduce["seconds"]))
        except (KeyError, TypeError, ValueError):
            raise FirescaleError("an allreduce measurement needs algorithm, bytes, ranks and seconds") from None
        ppp_comm = fit_comm_ppp(algo, nbytes, ranks, seconds, platform.link)
        comm_source = {"fitted": True, "algorithm": algo, "bytes": nbytes, "ranks": ranks, "seconds": seconds}
    return Calibration(platform.name, ppp_compute, ppp_comm, compute_source, comm_source)


def save_calibration(path: str | Path, calibration: Calibration) -> Path:
    return atomic_write_json(path, asdict(calibration))


def load_calibration(path: str | Path) -> Calibration:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise FirescaleError(f"cannot read calibration {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise FirescaleError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        cal = Calibration(str(data["site"]), float(data["ppp_compute"]), float(data["ppp_comm"]),
                          dict(data.get("compute_source", {})), dict(data.get("comm_source", {})))
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{path}: a calibration needs site, ppp_compute and ppp_comm") from None
    for key in ("ppp_compute", "ppp_comm"):
        if not 0 < getattr(cal, key) <= 1:
            raise FirescaleError(f"{path}: {key} must be in (0, 1], not {getattr(cal, key)}")
    return cal
