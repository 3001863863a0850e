"""Figures of memory and batch: per-layer memory in the style of Oh and Lee's Fig. 2, accuracy per batch phase."""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from firescale.model.memory import NetMemory, device_peaks
from firescale.report.collect import RunRecord
from firescale.report.plots import _empty, _figure, point_colours, save_figure, shade
from firescale.sweep.plan import SweepPlan


def memory_figure(memory: NetMemory, title: str, devices: Sequence[int] | None = None,
                  limit: float | None = None) -> Any:
    """Per layer, the bytes allocated in forward, backward and update (solid) and their running total,
    weights and history included (dotted); the peak in use (dashed) and the device's memory (dash-dot).
    With `devices` (one per layer record) the running total restarts on each device, and each device's
    peak is drawn over its layers."""
    fig = _figure(9.0, 4.8)
    ax = fig.add_subplot()
    ax.set_title(f"Memory per layer: {title}")
    layers = memory.layers
    devices = list(devices) if devices is not None else [0] * len(layers)
    x = range(len(layers))
    largest = max(sum(l.total for l in layers), 1)
    gb, unit = (1e9, "GB") if largest >= 1e9 else (1e6, "MB")
    for attr, label in (("forward", "forward"), ("backward", "backward"), ("update", "update")):
        ax.plot(x, [getattr(l, attr) / gb for l in layers], marker=".", linewidth=1.2, label=label)
    running, total, previous = [], 0, None
    for layer, d in zip(layers, devices):
        total = layer.total if d != previous else total + layer.total
        running.append(total / gb)
        previous = d
    ax.plot(x, running, linestyle=":", color="black", label="running total (allocated)")
    for peak in device_peaks(memory, devices):
        span = [i for i, d in enumerate(devices) if d == peak.device]
        ax.hlines(peak.bytes / gb, span[0], span[-1], linestyles="--", color="tab:red",
                  label="peak in use" if peak.device == 0 else None)
    if limit is not None and limit <= 3 * largest:
        ax.axhline(limit / gb, linestyle="-.", color="grey", label=f"device memory {limit / 1e9:g} GB")
    elif limit is not None:
        ax.plot([], [], linestyle="-.", color="grey", label=f"device memory {limit / 1e9:g} GB (off the scale)")
    step = max(1, len(layers) // 40)
    ax.set_xticks(list(x)[::step], [l.name for l in layers][::step], rotation=90, fontsize="x-small")
    ax.set_ylabel(unit)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def write_memory_plot(memory: NetMemory, out_dir: str | Path, title: str, *, stem: str = "memory",
                      devices: Sequence[int] | None = None, limit: float | None = None) -> list[Path]:
    """memory.png and memory.pdf in `out_dir`, atomically."""
    return save_figure(memory_figure(memory, title, devices, limit), Path(out_dir), stem)


def accuracy_by_batch_figure(runs: Sequence[tuple[str, Any]], title: str) -> Any:
    """Top-1 against iterations for each run, one line per batch phase (a schedule's later phases
    continue the line of its first with another marker), as the seed's Table 1 compares B=8, 16, 16+; a colour per
    point, its repeats (NAME-rK) in shades of it."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title(f"Top-1 accuracy against iterations, by batch: {title}")
    runs = [(name, train) for name, train in runs if train is not None and train.evals]
    if not runs:
        _empty(ax, "No run has evaluations.")
        return fig
    markers = "o^sv<>"
    groups = [re.sub(r"-r\d+$", "", name) for name, _ in runs]   # a point's repeats share its colour, in shades
    colours = point_colours(list(dict.fromkeys(groups)))
    for (name, train), group in zip(runs, groups):
        repeats = [n for (n, _), g in zip(runs, groups) if g == group]
        first, colour = name == repeats[0], shade(colours[group], repeats.index(name), len(repeats))
        many = f" ({len(repeats)} repeats, in shades)" if len(repeats) > 1 else ""
        phases = train.batch.get("schedule") or [{"iteration": 0, "total_batch": train.batch["total_batch"]}]
        starts = [p["iteration"] for p in phases] + [float("inf")]
        for k, phase in enumerate(phases):
            evals = [e for e in train.evals if starts[k] < e.iter <= starts[k + 1] or (k == 0 and e.iter == 0)]
            if k:
                evals = [prev for prev in train.evals if prev.iter <= starts[k]][-1:] + evals
            label = (f"{group}: B={phase['total_batch']}" + ("" if k == 0 else f" from {phase['iteration']}")
                     + many) if first else "_nolegend_"
            ax.plot([e.iter for e in evals], [e.top1 * 100 for e in evals], marker=markers[k % len(markers)],
                    linewidth=1.2, label=label, color=colour, gid=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def write_accuracy_by_batch(runs: Sequence[tuple[str, Any]], out_dir: str | Path, title: str) -> list[Path]:
    """accuracy_by_batch.png and .pdf in `out_dir`, atomically."""
    return save_figure(accuracy_by_batch_figure(runs, title), Path(out_dir), "accuracy_by_batch")


def write_memory_and_batch_figures(plan: SweepPlan, experiment: str, records: list[RunRecord],
                                   out: str) -> list[Path]:
    """memory.png (the net's memory per layer at the baseline's batch, on the site's device) and
    accuracy_by_batch.png (top-1 against iterations, a line per batch phase), before report.md."""
    from firescale.caffe.solver import load_solver
    from firescale.model.memory import net_memory
    from firescale.nets.device_plan import arch_devices, record_devices
    from firescale.predict.memory_fit import experiment_solver

    site = plan.site
    baseline = next((p for p in plan.points.get(experiment, []) if p.baseline), None)
    written: list[Path] = []
    if baseline is not None and site.name in plan.experiment(experiment)["sites"]:
        spec, solver_path = experiment_solver(plan, experiment)
        solver = load_solver(solver_path)
        memory = net_memory(spec, baseline.batch_per_gpu, solver.type, weight_decay=solver.weight_decay > 0,
                            device_kind=site.device_kind)
        layer_plan = solver.dist
        devices = None
        if layer_plan:
            devices = record_devices(spec, arch_devices(layer_plan.train[0], spec, str(solver_path)))
        written += write_memory_plot(memory, out, f"{spec.name}, {baseline.batch_per_gpu} per device, {solver.type}, "
                                                  f"{site.config['device']['name']}", devices=devices,
                                     limit=site.device_memory)
    ordered = sorted(records, key=lambda r: (not r.baseline, r.gpus, r.batch, r.lr, r.repeat))  # as the rows
    runs = [(r.point, r.train) for r in ordered if r.train is not None]
    return written + write_accuracy_by_batch(runs, out, f"{experiment} on {site.name}")

