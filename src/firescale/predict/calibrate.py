"""Calibration as Paleo does it: fit compute and communication percent-of-peak (and an overhead) from measurements."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json, load_json
from firescale.bench.allreduce_record import AllreduceMeasurement
from firescale.errors import FirescaleError
from firescale.frameworks import FRAMEWORK_ALGORITHMS, MPI_ALLREDUCE, by_algorithm
from firescale.model.comm import LIBRARY_DEFAULTS
from firescale.model.cycle import allreduce_without_wait
from firescale.model.hierarchy import fit_inter_node_ppp, fit_intra_node_ppp
from firescale.model.layers import net_cost
from firescale.model.paleo import Device, Platform, compute_times
from firescale.nets.spec import NetSpec
from firescale.nets.zoo import get_net


@dataclass(frozen=True)
class Calibration:
    """Fitted percent-of-peak factors, the fixed per-iteration overhead, and the measurements behind them.

    `overhead_s` goes beyond Paleo (see paleo.Platform); it is 0 when only one batch size was measured.
    `eval_s` is one evaluation of the test set on one device, as the baseline measured it (0: not measured).
    `contention` is a rank's compute time with every rank of its node computing over its time alone,
    measured with the net's own short run (predict.measurements.contention; 1: not measured);
    `contention_across` the same with every rank of several nodes computing (Platform.contention_at).
    `read_bandwidth` is the bytes per second one node read the dataset at, by `bench io`'s raw read
    (0: not measured), and `io_source` what it was read from (`read_bandwidth_measurement`).
    """

    site: str
    ppp_compute: float
    ppp_comm: float
    compute_source: dict[str, Any]
    comm_source: dict[str, Any]
    overhead_s: float = 0.0
    eval_s: float = 0.0
    contention: float = 1.0
    read_bandwidth: float = 0.0
    io_source: dict[str, Any] = field(default_factory=dict)
    comm_hidden_share: float | None = None   # measured by an overlapped probe (None: the site's kind decides)
    ppp_comm_intra: float | None = None      # the intra-node link's, measured apart (None: it takes ppp_comm)
    contention_across: tuple[tuple[int, float], ...] = ()   # (nodes, factor): copies on that many nodes at once

    def apply(self, platform: Platform) -> Platform:
        """The platform with these factors (and this overhead and contention) in place of its own, and
        this read bandwidth as its node's when it has none: a site's `storage.read_gbytes_per_s` wins."""
        data = platform.data
        if self.read_bandwidth > 0 and data.read_bandwidth == 0:
            data = replace(data, read_bandwidth=self.read_bandwidth, read_source="calibration")
        share = platform.comm_hidden_share if self.comm_hidden_share is None else self.comm_hidden_share
        links = platform.links if self.ppp_comm_intra is None else replace(platform.links,
                                                                            intra_ppp=self.ppp_comm_intra)
        return replace(platform, device=replace(platform.device, ppp=self.ppp_compute),
                       link=replace(platform.link, ppp=self.ppp_comm), overhead_s=self.overhead_s,
                       contention=self.contention, contention_across=self.contention_across, data=data,
                       comm_hidden_share=share, links=links)

    def with_contention(self, measured: list[dict[str, Any]]) -> Calibration:
        """These factors with the contention measured (measurements.contention_medians: the one node's first,
        then each count of nodes spanned), the rounds behind them under compute_source."""
        one, *across = measured
        source = {**self.compute_source, "contention": one, **({"contention_across": across} if across else {})}
        return replace(self, contention=one["factor"], compute_source=source,
                       contention_across=tuple((c["nodes"], c["factor"]) for c in across))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ideal_compute_s(spec: NetSpec, batch: int, device: Device, elementwise: bool) -> float:
    """One device's forward + backward + update time for `batch` at 100% of peak."""
    return compute_times(net_cost(spec, batch), replace(device, ppp=1.0), elementwise=elementwise).compute


def _check_ppp(ppp: float, device: Device, measured_s: float, ideal_s: float) -> float:
    if ppp > 1.0:
        raise FirescaleError(f"device {device.name!r}: a measured iteration of {measured_s:.4g} s is "
                             f"faster than the peak allows ({ideal_s:.4g} s); raise the site's "
                             f"device.peak_tflops or memory_bandwidth_gbs")
    return ppp


def allreduce_from_run(ranks: int, allreduce_s: float, spec: NetSpec, algorithm: str,
                       *, after_step_s: float = 0.0) -> dict[str, Any]:
    """An allreduce measurement (for `calibrate`) from a multi-rank training run: its mean allreduce time
    for the net's gradients, after the rest of its iteration (`after_step_s`).  It includes what the
    framework adds per allreduce (Horovod's negotiation and its cycle, waiting for the slowest rank),
    which an MPI benchmark does not see."""
    if ranks < 2 or allreduce_s <= 0:
        raise FirescaleError(f"fitting communication from a training run needs 2 or more ranks and a positive "
                             f"allreduce time, got {ranks} ranks and {allreduce_s} s")
    return {"algorithm": algorithm, "measured": "horovod", "bytes": net_cost(spec, 1).weight_bytes, "ranks": ranks,
            "seconds": allreduce_s, "after_step_s": after_step_s}


def allreduce_measurement(path: str, algorithm: str, nbytes: float | None = None,
                          process_group: str | None = None) -> dict:
    """The measurement to fit from: a trainer's own allreduce when the file has it (what training pays, in the
    order of frameworks.FRAMEWORK_ALGORITHMS: Horovod's, else torch's over `process_group`, the one the runs use:
    gloo, mpi or nccl; None: the only one the file has), else the site's algorithm (MPI_Allreduce itself, `mpi`,
    for a library's own choice); on the most ranks, at the size nearest `nbytes` (else the largest).  Its median,
    or after a step its mean: there Horovod's allreduce waits a varying part of its negotiation cycle, and
    training pays the mean.  A framework's allreduce over a process group is fitted to the model of that group
    (collectives.process_group_model: Gloo's ring, else `algorithm`), so that a Gloo run is priced as Gloo and an
    MPI one as MPI.  A time below zero (a step timed longer without the allreduce than with it) is refused: no
    link fits it."""
    from firescale.cluster.collectives import process_group_model

    listed = read_allreduce_record(path)
    runs = [m for m in listed if m.ranks > 1]
    fallback = MPI_ALLREDUCE if algorithm in LIBRARY_DEFAULTS else algorithm
    measured = next((own for own in FRAMEWORK_ALGORITHMS if any(m.algorithm == own for m in runs)), fallback)
    runs = [m for m in runs if m.algorithm == measured]
    ours = by_algorithm(measured)
    if ours is not None and ours.names_process_group:
        runs = _over_process_group(path, measured, runs, process_group)
    if not runs:
        raise FirescaleError(f"{path}: no {', '.join(repr(a) for a in FRAMEWORK_ALGORITHMS)} or '{fallback}' "
                             "measurement over 2 or more ranks")
    most = max(m.ranks for m in runs)
    runs = [m for m in runs if m.ranks == most]
    best = (min(runs, key=lambda m: abs(m.bytes - nbytes)) if nbytes else max(runs, key=lambda m: m.bytes))
    after_step = best.compute_s
    seconds = best.mean_s if after_step else best.median_s
    if seconds < 0:   # after a step: the iterations timed shorter with the allreduce than without it
        raise FirescaleError(f"{path}: the {measured} allreduce over {best.ranks} ranks timed "
                             f"{seconds * 1e3:.3f} ms, below zero (its iterations took less with it than "
                             "without it): the cores were too busy to time it; measure again")
    found = {"algorithm": algorithm, "measured": measured, "bytes": best.bytes, "ranks": best.ranks,
             "seconds": seconds, "after_step_s": after_step, "source": str(path)}
    if best.process_group:
        found["process_group"] = best.process_group
        found["algorithm"] = process_group_model(best.process_group, algorithm)
    if best.hidden_share is not None:   # timed beside the step too (bench allreduce --overlap-ms)
        found["hidden_share"] = best.hidden_share
    return found


def read_allreduce_record(path: str | Path) -> list[AllreduceMeasurement]:
    """The measurements of a `firescale bench allreduce --json` record, each checked (one sentence naming the file
    and the entry for one that lacks a key)."""
    data = load_json(path, "allreduce measurements")
    listed = data.get("measurements") if isinstance(data, dict) else None
    if not isinstance(listed, list):
        raise FirescaleError(f"{path}: not a `firescale bench allreduce --json` record (a JSON object with a "
                             "list 'measurements')")
    return [AllreduceMeasurement.from_dict(r, f"{path}: measurements[{k}]") for k, r in enumerate(listed)]


def _over_process_group(path: str, measured: str, runs: list[AllreduceMeasurement], process_group: str | None
                        ) -> list[AllreduceMeasurement]:
    """A framework's measurements over `process_group` (None: the file's only group; a measurement that names none
    is taken as any).  One sentence where the file timed other groups only, or several and none was named."""
    groups = sorted({m.process_group for m in runs if m.process_group})
    if process_group is None:
        if len(groups) > 1:
            raise FirescaleError(f"{path}: {measured}'s allreduce was timed over the process groups "
                                 f"{', '.join(groups)}; name the one the runs use (--process-group)")
        return runs
    if groups and process_group not in groups:
        ours = by_algorithm(measured)
        raise FirescaleError(f"{path}: {measured}'s allreduce was timed over {', '.join(groups)}, not over "
                             f"{process_group}, the process group the runs use; time it with `firescale bench "
                             f"allreduce --framework {ours.name if ours else measured} --process-groups "
                             f"{process_group}`")
    return [m for m in runs if m.process_group in (process_group, "")]


def read_bandwidth_measurement(path: str | Path, fmt: str | None = None) -> tuple[float, dict[str, Any]]:
    """One node's read bandwidth (bytes/s) from a `firescale bench io --json` record, and what it was read
    from: the raw sequential read of `fmt`, by default of the format the trainer reads (LMDB when the
    record has it, else its only one)."""
    data = load_json(path, "bench io record")
    if not isinstance(data, dict):
        raise FirescaleError(f"{path}: not a `firescale bench io --json` record (a JSON object with 'readers')")
    for key in ("dataset", "batch", "readers"):
        if key not in data:
            raise FirescaleError(f"{path}: not a `firescale bench io --json` record (no key {key!r})")
    readers = data["readers"]
    if not isinstance(readers, dict) or not readers:
        raise FirescaleError(f"{path}: 'readers' must map each measured format to its rates, not {readers!r}")
    if fmt is None:
        if "lmdb" not in readers and len(readers) > 1:
            raise FirescaleError(f"{path} measured {', '.join(sorted(readers))}: choose one with --io-format")
        fmt = "lmdb" if "lmdb" in readers else next(iter(readers))
    if fmt not in readers:
        raise FirescaleError(f"{path}: 'readers' has no {fmt!r}; it measured {', '.join(sorted(readers))}")
    entry = readers[fmt]
    raw = entry.get("raw_sequential") if isinstance(entry, dict) else None
    if not isinstance(raw, dict) or "MB_per_s" not in raw:
        raise FirescaleError(f"{path}: not a `firescale bench io --json` record (no key "
                             f"'readers.{fmt}.raw_sequential.MB_per_s')")
    rate = raw["MB_per_s"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (rate > 0 and math.isfinite(rate)):
        raise FirescaleError(f"{path}: readers.{fmt}.raw_sequential.MB_per_s must be a number > 0 (MB per "
                             f"second), not {rate!r}")
    source: dict[str, Any] = {"source": str(path), "measured": "bench io: raw sequential read on one node",
                              "dataset": data["dataset"], "format": fmt, "split": data.get("split"),
                              "batch": data["batch"], "seconds": data.get("seconds"), "file": entry.get("file"),
                              "file_bytes": entry.get("file_bytes"), "raw_MB_per_s": rate}
    shuffled = entry.get("shuffled")
    if isinstance(shuffled, dict) and "MB_per_s" in shuffled:
        source["reader_shuffled_MB_per_s"] = shuffled["MB_per_s"]
    if "measured_at" in data:
        source["measured_at"] = data["measured_at"]
    return float(rate) * 1e6, source


def fit_compute_ppp(net: NetSpec | str, batch: int, measured_iteration_s: float, device: Device,
                    *, elementwise: bool = True) -> float:
    """The compute percent of peak that makes one device's predicted iteration equal the measured one."""
    if measured_iteration_s <= 0:
        raise FirescaleError(f"the measured iteration time must be positive, not {measured_iteration_s}")
    spec = get_net(net) if isinstance(net, str) else net
    ideal = _ideal_compute_s(spec, batch, device, elementwise)
    return _check_ppp(ideal / measured_iteration_s, device, measured_iteration_s, ideal)


def fit_compute_and_overhead(net: NetSpec | str, runs: Sequence[tuple[int, float]], device: Device,
                             *, elementwise: bool = True) -> tuple[float, float, dict[str, Any]]:
    """Fit t(b) = overhead + ideal_compute(b) / ppp to single-device runs [(batch, seconds per iteration)].

    Least squares over the runs, within what is physical: ppp <= 1 (no device beats its peak) and
    overhead >= 0; they must cover at least two batch sizes.  Returns (ppp, overhead_s, details).
    When the unconstrained fit leaves those bounds (noise on a shared machine, a device that gets
    more efficient as the batch grows, or one whose time is mostly overhead), the bound is kept and
    the other term refitted, and the details say which and why.
    """
    spec = get_net(net) if isinstance(net, str) else net
    if any(t <= 0 or b < 1 for b, t in runs):
        raise FirescaleError(f"measured runs need batch >= 1 and a positive iteration time, got {list(runs)}")
    if len({b for b, _ in runs}) < 2:
        raise FirescaleError("fitting a per-iteration overhead needs single-device runs at two or more "
                             f"different batch sizes, got batches {sorted({b for b, _ in runs})}")
    xs = [_ideal_compute_s(spec, b, device, elementwise) for b, _ in runs]
    ys = [t for _, t in runs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    overhead = my - slope * mx
    details: dict[str, Any] = {"runs": [{"batch": b, "measured_iteration_s": t, "ideal_compute_s": x}
                                        for (b, t), x in zip(runs, xs)]}
    grown = "; ".join(f"batch {b}: {t * 1e3:.3f} ms" for b, t in runs)
    if overhead < 0:
        slope = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        details["overhead_clamped"] = f"the fit gave {overhead * 1e3:.4g} ms; set to 0"
        overhead = 0.0
    if slope < 1.0:
        # Time grows more slowly than the peak allows: compute at the peak, the rest is overhead.
        details["compute_clamped"] = (f"the measured time grew by {slope:.3g} s per second of ideal compute "
                                      f"({grown}), less than the peak allows (1); compute set to the peak and "
                                      "the rest taken as overhead")
        slope, overhead = 1.0, my - mx
        if overhead < 0:
            raise FirescaleError(f"device {device.name!r}: the measured iterations ({grown}) are faster than "
                                 "the peak allows; raise the site's device.peak_tflops or memory_bandwidth_gbs")
    ppp = 1.0 / slope
    residuals = [y - (overhead + x * slope) for x, y in zip(xs, ys)]
    details["max_residual_percent"] = max(abs(r) / y for r, y in zip(residuals, ys)) * 100
    return ppp, overhead, details


def calibrate(platform: Platform, net: NetSpec | str, batch: int, measured_iteration_s: float,
              allreduce: dict[str, Any] | None = None, *,
              more_runs: Sequence[tuple[int, float]] = ()) -> Calibration:
    """Fit the factors.  `allreduce` is {"algorithm", "bytes", "ranks", "seconds"} from a benchmark;
    without it the communication factor stays at the platform's.  `more_runs` are further single-device
    (batch, seconds per iteration) measurements: when their batches differ from `batch`, the fixed
    per-iteration overhead is fitted beside the compute factor; otherwise the overhead is 0 (Paleo)."""
    spec = get_net(net) if isinstance(net, str) else net
    runs = [(batch, measured_iteration_s), *more_runs]
    compute_source: dict[str, Any] = {"net": spec.name, "batch": batch, "measured_iteration_s": measured_iteration_s}
    refused = None
    if len({b for b, _ in runs}) >= 2:
        try:
            ppp_compute, overhead, details = fit_compute_and_overhead(spec, runs, platform.device,
                                                                      elementwise=platform.elementwise)
            compute_source.update(details, overhead_fitted=True)
        except FirescaleError as exc:
            # Runs faster than the peak allows: the single factor from the baseline says so below.
            refused = str(exc)
    if len({b for b, _ in runs}) < 2 or refused:
        ppp_compute = fit_compute_ppp(spec, batch, measured_iteration_s, platform.device,
                                      elementwise=platform.elementwise)
        overhead = 0.0
        compute_source["overhead_fitted"] = False
        if refused:
            compute_source["overhead_fit_refused"] = refused
            device, elementwise = platform.device, platform.elementwise
            compute_source["runs"] = [{"batch": b, "measured_iteration_s": s,
                                       "ideal_compute_s": _ideal_compute_s(spec, b, device, elementwise)}
                                      for b, s in runs]
    ppp_comm, ppp_intra = platform.link.ppp, None
    comm_source: dict[str, Any] = {"fitted": False}
    if allreduce is not None:
        comm_source, own = _measured_allreduce(allreduce, platform)
        algo, nbytes, ranks = comm_source["algorithm"], comm_source["bytes"], comm_source["ranks"]
        if allreduce.get("intra") is not None and platform.links.intra is not None:
            # An allreduce within one node as well: the intra-node link gets a factor of its own.
            intra_source, intra_own = _measured_allreduce(allreduce["intra"], platform)
            comm_source["intra"] = intra_source
            if intra_own is not None:
                ppp_intra = fit_intra_node_ppp(intra_source["algorithm"], intra_source["bytes"],
                                               intra_source["ranks"], intra_own, platform.link, platform.links)
        if own is not None and platform.links.intra is not None and ranks <= platform.links.ranks_per_node:
            # Within one node alone: every hop on the link inside it, which takes the one factor as the other does.
            ppp_comm = fit_intra_node_ppp(algo, nbytes, ranks, own, platform.link, platform.links)
        elif own is not None:
            ppp_comm = fit_inter_node_ppp(algo, nbytes, ranks, own, platform.link,
                                          replace(platform.links, intra_ppp=ppp_intra))
    share = None if allreduce is None or allreduce.get("hidden_share") is None else float(allreduce["hidden_share"])
    return Calibration(platform.name, ppp_compute, ppp_comm, compute_source, comm_source, overhead,
                       comm_hidden_share=share, ppp_comm_intra=ppp_intra)


def _measured_allreduce(allreduce: dict[str, Any], platform: Platform) -> tuple[dict[str, Any], float | None]:
    """What a calibration records of an allreduce measurement, and the seconds to fit the link to: Horovod's
    wait for its negotiation cycle taken out (the model adds it per point); None when the measured
    iterations ran at one per cycle, so that any allreduce short enough gives the same time."""
    try:
        algo, nbytes, ranks, seconds = (allreduce["algorithm"], float(allreduce["bytes"]),
                                        int(allreduce["ranks"]), float(allreduce["seconds"]))
    except (KeyError, TypeError, ValueError):
        raise FirescaleError("an allreduce measurement needs algorithm, bytes, ranks and seconds") from None
    source: dict[str, Any] = {
        "fitted": True, "algorithm": algo, "bytes": nbytes, "ranks": ranks, "seconds": seconds,
        **{k: allreduce[k] for k in ("measured", "after_step_s", "source", "hidden_share", "rounds_s",
                                     "process_group") if k in allreduce}}
    measured = allreduce.get("measured")
    waits = by_algorithm(measured) if isinstance(measured, str) else None
    if waits is None or not waits.negotiation_cycle:
        return source, seconds
    step = float(allreduce.get("after_step_s", 0.0))
    own, determined = allreduce_without_wait(seconds, step, platform.cycle_s)
    source.update(cycle_s=platform.cycle_s, cycle_wait_s=seconds - own, allreduce_own_s=own)
    if determined:
        return source, own
    source.update(fitted=False, allreduce_at_most_s=platform.cycle_s - step, why=(
        f"the measured iterations ran at one per Horovod cycle ({platform.cycle_s * 1e3:g} ms): any "
        f"allreduce up to {(platform.cycle_s - step) * 1e3:.3g} ms gives the same time, so the "
        "communication factor stays at the platform's"))
    return source, None


def save_calibration(path: str | Path, calibration: Calibration) -> Path:
    return atomic_write_json(path, calibration.to_dict())


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
                          dict(data.get("compute_source", {})), dict(data.get("comm_source", {})),
                          float(data.get("overhead_s", 0.0)), float(data.get("eval_s", 0.0)),
                          float(data.get("contention", 1.0)), float(data.get("read_bandwidth", 0.0)),
                          dict(data.get("io_source", {})),
                          None if data.get("comm_hidden_share") is None else float(data["comm_hidden_share"]),
                          None if data.get("ppp_comm_intra") is None else float(data["ppp_comm_intra"]))
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{path}: a calibration needs site, ppp_compute and ppp_comm") from None
    for key in ("ppp_compute", "ppp_comm", "ppp_comm_intra"):
        if getattr(cal, key) is not None and not 0 < getattr(cal, key) <= 1:
            raise FirescaleError(f"{path}: {key} must be in (0, 1], not {getattr(cal, key)}")
    if not (cal.contention > 0 and math.isfinite(cal.contention)):
        raise FirescaleError(f"{path}: contention must be a number > 0 (a ratio of times), not {cal.contention}")
    across = data.get("contention_across") or []
    for pair in across:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int) and pair[0] > 1
                and isinstance(pair[1], (int, float)) and pair[1] > 0 and math.isfinite(pair[1])):
            raise FirescaleError(f"{path}: contention_across lists [nodes, factor] pairs, 2 or more nodes and a "
                                 f"factor > 0 (a ratio of times), not {pair!r}")
    cal = replace(cal, contention_across=tuple((n, float(f)) for n, f in across))
    for key in ("overhead_s", "eval_s"):
        value = getattr(cal, key)
        if not (value >= 0 and math.isfinite(value)):
            raise FirescaleError(f"{path}: {key} must be a number >= 0 (seconds), not {value}")
    if not (cal.read_bandwidth >= 0 and math.isfinite(cal.read_bandwidth)):
        raise FirescaleError(f"{path}: read_bandwidth must be a number >= 0 (bytes per second), "
                             f"not {cal.read_bandwidth}")
    if cal.comm_hidden_share is not None and not 0 <= cal.comm_hidden_share <= 1:
        raise FirescaleError(f"{path}: comm_hidden_share must be in [0, 1] (a share of the allreduce), "
                             f"not {cal.comm_hidden_share}")
    return cal
