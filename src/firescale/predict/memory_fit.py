"""Does each sweep point fit its devices' memory?  How far over, and which layer split (or batch) would fit."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firescale.caffe.dist import DevicePlan
from firescale.caffe.solver import SolverConfig, load_solver
from firescale.cluster.site import SiteProfile
from firescale.errors import FirescaleError
from firescale.model.memory import NetMemory, net_memory
from firescale.model.split import LayerSplit, check_plan_memory, largest_batch_that_fits, plan_peaks, propose_split
from firescale.nets.device_plan import arch_devices, check_devices, read_layer_plan
from firescale.nets.spec import NetSpec
from firescale.predict.trained_net import trained_net
from firescale.sweep.paths import resolve
from firescale.sweep.plan import SweepPlan
from firescale.sweep.points import SweepPoint


@dataclass(frozen=True)
class MemoryFit:
    """One sweep point's memory on its site: the peak of each device of a replica against the limit.

    `problem` is one sentence when the point does not fit (how far over, where it peaks, a split over
    the fewest devices that fits and the largest batch per device that would), else None.
    """

    point: str
    batch_per_gpu: int
    limit: float
    peaks: tuple[int, ...]
    at: tuple[str, ...]
    proposal: LayerSplit | None = None
    largest_batch: int | None = None
    problem: str | None = None

    @property
    def fits(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "batch_per_gpu": self.batch_per_gpu, "limit_bytes": self.limit,
                "peak_bytes": list(self.peaks), "peak_at": list(self.at),
                "over_bytes": max(0.0, max(self.peaks) - self.limit),
                "proposed_split": self.proposal.describe() if self.proposal else None,
                "proposed_dist": self.proposal.dist() if self.proposal else None,
                "largest_batch_per_gpu": self.largest_batch, "problem": self.problem}


def _memory(spec: NetSpec, batch: int, solver: SolverConfig, site: SiteProfile, ranks: int) -> NetMemory:
    return net_memory(spec, batch, solver.type, weight_decay=solver.weight_decay > 0,
                      device_kind=site.device_kind, ranks=ranks)


def _over(spec: NetSpec, point: str, batch: int, solver: SolverConfig, site: SiteProfile, ranks: int) -> MemoryFit:
    memory = _memory(spec, batch, solver, site, ranks)
    peak = plan_peaks(memory, spec, [0] * len(spec.layers))[0]
    limit = site.device_memory
    if peak.bytes <= limit:
        return MemoryFit(point, batch, limit, (peak.bytes,), (peak.at,))
    device = site.config["device"]["name"]
    proposal = propose_split(memory, spec, limit)
    largest = largest_batch_that_fits(spec, limit, lambda b: _memory(spec, b, solver, site, ranks), batch)
    text = (f"point {point} needs {peak.bytes / 1e9:.2f} GB on one {device} ({batch} images per GPU, "
            f"{solver.type}), {(peak.bytes - limit) / 1e9:.2f} GB over its {limit / 1e9:g} GB (peak at {peak.at})")
    if proposal is not None:
        text += (f"; a split over {len(proposal.peaks)} devices fits: {proposal.describe()} "
                 f"(solver file: {' '.join(proposal.dist().split())})")
        if len(proposal.peaks) > site.gpus_per_node:
            text += f", but site {site.name} has {site.gpus_per_node} GPU(s) per node"
    text += f"; {largest} images per GPU would fit one device" if largest else "; not even 1 image per GPU fits"
    return MemoryFit(point, batch, limit, (peak.bytes,), (peak.at,), proposal, largest, text)


def _planned(spec: NetSpec, point: str, batch: int, solver: SolverConfig, site: SiteProfile, ranks: int,
             plan: DevicePlan) -> MemoryFit:
    memory = _memory(spec, batch, solver, site, ranks)
    check_devices(plan, site.gpus_per_node, f"a node of site {site.name}")
    limit = site.device_memory
    peaks = []
    for k, arch in enumerate(plan.train):
        where = f"{plan.source}: dist (train) arch {k}"
        peaks = check_plan_memory(memory, spec, arch_devices(arch, spec, where), [limit], f"{where}, at point {point},")
    return MemoryFit(point, batch, limit, tuple(p.bytes for p in peaks), tuple(p.at for p in peaks))


def fit_points(spec: NetSpec, solver_path: str | Path, points: Sequence[SweepPoint], site: SiteProfile,
               base: Path) -> list[MemoryFit]:
    """The memory of every sweep point on `site`, at its largest batch per replica (a batch schedule's
    largest phase); a layer plan (the point's own `layer_plan` file, else Oh and Lee's `dist` blocks in
    the solver file, relative paths read from `base`) is checked against the net, the node's devices and
    their memory."""
    solver = load_solver(solver_path)
    out = []
    for p in points:
        plan = read_layer_plan(resolve(p.layer_plan, base)) if p.layer_plan else solver.dist
        if plan is None:
            out.append(_over(spec, p.name, p.peak_batch_per_gpu, solver, site, p.ranks))
            continue
        try:
            out.append(_planned(spec, p.name, p.peak_batch_per_gpu, solver, site, p.ranks, plan))
        except FirescaleError as exc:
            out.append(MemoryFit(p.name, p.peak_batch_per_gpu, site.device_memory, (), (), problem=str(exc)))
    return out


def experiment_fits(plan: SweepPlan, experiment: str, points: Sequence[Any]) -> list[MemoryFit]:
    """fit_points for an experiment of the plan: its net as it trains on the site's copy of the dataset."""
    spec, solver = experiment_solver(plan, experiment)
    return fit_points(spec, solver, points, plan.site, plan.base)


def experiment_solver(plan: SweepPlan, experiment: str) -> tuple[NetSpec, Path]:
    """The experiment's net as it trains on the plan's site's copy of the dataset, and its solver file."""
    return trained_net(plan, experiment).spec, plan.resolve(plan.experiment(experiment)["solver"])
