"""Predicted against measured iteration time on this machine: calibrate on one set of runs, test on fresh ones."""
from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from firescale.cluster.ranks import SiteRanks
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK
from firescale.model.paleo import Platform, predict_point
from firescale.nets.spec import NetSpec
from firescale.predict.calibrate import Calibration, allreduce_from_run, calibrate
from firescale.predict.measurements import MeasuredIteration, contention_medians, read_measured_iteration


@dataclass(frozen=True)
class TrainRuns:
    """How to start `firescale train` for the check: dataset, net, solver, iterations and the site's ranks."""

    dataset: Path
    net: str
    solver: Path
    iterations: int
    workdir: Path
    ranks: SiteRanks
    timeout: float = 900.0
    reference_batch: int | None = None   # scale base_lr linearly from this batch (keeps small batches stable)
    overlap_allreduce: bool = False      # runs of several ranks overlap the allreduce; predicted so too
    framework: str = DEFAULT_FRAMEWORK   # the trainer's backend (firescale.frameworks)

    def run(self, ranks: int, total_batch: int, name: str) -> MeasuredIteration:
        """One run of `iterations` timed iterations, no evaluation or snapshot; its mean iteration."""
        out = self.workdir / name
        cmd = [sys.executable, "-m", "firescale", "train", "--dataset", str(self.dataset), "--net", self.net,
               "--solver", str(self.solver), "--total-batch", str(total_batch), "--out", str(out),
               "--set", f"max_iter={self.iterations}", "--set", "test_interval=0",
               "--set", "test_initialization=false", "--set", "snapshot=0",
               "--set", "snapshot_after_train=false", "--set", f"display={self.iterations}"]
        if self.reference_batch:
            cmd += ["--lr-scaling", "linear", "--reference-batch", str(self.reference_batch)]
        if self.overlap_allreduce and ranks > 1:
            cmd.append("--overlap-allreduce")
        if self.framework != DEFAULT_FRAMEWORK:
            cmd += ["--framework", self.framework]
        self.ranks.run(ranks, cmd, f"training run {name}", timeout=self.timeout)
        return read_measured_iteration(out / "result.json")


@dataclass
class CheckRow:
    """One rank count: the model's iteration time beside the median of the measured ones."""

    ranks: int
    total_batch: int
    batch_per_rank: int
    predicted_s: float
    comm_s: float
    measured_s: list[float]
    measured_allreduce_s: list[float]
    cycle_wait_s: float = 0.0   # of predicted_s, the wait for Horovod's negotiation cycle (model/cycle.py)

    @property
    def median_s(self) -> float:
        return statistics.median(self.measured_s)

    @property
    def best_s(self) -> float:
        """The fastest run: on a shared machine other load only ever adds time, so this is the least disturbed."""
        return min(self.measured_s)

    @property
    def error_percent(self) -> float:
        """Predicted against the fastest run, in percent of it."""
        return (self.predicted_s - self.best_s) / self.best_s * 100

    @property
    def error_median_percent(self) -> float:
        return (self.predicted_s - self.median_s) / self.median_s * 100

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median_s": self.median_s, "best_s": self.best_s, "error_percent": self.error_percent,
                "error_median_percent": self.error_median_percent}


def prediction_check(runs: TrainRuns, spec: NetSpec, platform: Platform, total_batch: int, ranks: Sequence[int],
                     repeats: int, *, allreduce: dict[str, Any] | None = None, fit_comm: bool = False,
                     probe: Callable[[float], dict[str, Any]] | None = None,
                     contend: Callable[[MeasuredIteration], list[dict[str, Any]]] | None = None,
                     say: Callable[[str], None] = lambda s: None) -> tuple[Calibration, list[CheckRow]]:
    """Calibrate from single-rank runs at the total batch and at the per-rank batch of the largest rank
    count, then predict and measure `total_batch` split over each rank count, in fresh runs.

    With `fit_comm`, a separate run on the largest rank count fits the communication factor from the
    trainer's own allreduce time; with `probe` (as the workflow calibrates), the communication
    measurement comes from probe(step seconds), given the fastest small-batch iteration less its allreduce,
    once a round; the fastest probe is taken.  With `contend` (as the workflow calibrates a site whose ranks
    share a node), contend(that round's small-batch run) measures the node's contention once a round (and
    where the most ranks span nodes, across them: one measurement per node count, `measurements.contention`),
    and the median of the rounds' factors at each node count scales the compute of the points of several ranks.
    Runs go round-robin, `repeats` rounds, so that a change in the machine's load touches every case;
    each calibration point takes its fastest run.
    """
    if repeats < 1 or total_batch % max(ranks):
        raise FirescaleError(f"need repeats >= 1 and a total batch {total_batch} divisible by {max(ranks)} ranks")
    small = total_batch // max(ranks)
    cal_batches = sorted({total_batch, small}, reverse=True)
    calibration_runs: dict[int, list[float]] = {b: [] for b in cal_batches}
    measured: dict[int, list[MeasuredIteration]] = {r: [] for r in ranks}
    comm_runs: list[MeasuredIteration] = []
    small_runs: list[MeasuredIteration] = []
    probes: list[dict[str, Any]] = []
    contended: list[dict[str, Any]] = []
    for k in range(repeats):
        for b in cal_batches:
            m = runs.run(1, b, f"calibrate-b{b}-{k}")
            calibration_runs[b].append(m.iteration_s)
            if b == small:
                small_runs.append(m)
            say(f"round {k + 1}: calibration, 1 rank, batch {b}: {m.iteration_s * 1e3:.3f} ms")
        if fit_comm:
            m = runs.run(max(ranks), total_batch, f"calibrate-comm-r{max(ranks)}-{k}")
            comm_runs.append(m)
            say(f"round {k + 1}: calibration, {max(ranks)} ranks, total batch {total_batch}: allreduce "
                f"{m.allreduce_s * 1e3:.3f} ms of {m.iteration_s * 1e3:.3f} ms")
        if probe is not None:
            probes.append(probe(min(m.iteration_s - m.allreduce_s for m in small_runs)))
            say(f"round {k + 1}: allreduce probe after a {probes[-1].get('after_step_s', 0) * 1e3:.3f} ms step: "
                f"{probes[-1]['seconds'] * 1e3:.3f} ms"
                + (f" ({probes[-1]['intra']['ranks']} ranks of one node: {probes[-1]['intra']['seconds'] * 1e3:.3f} ms)"
                   if "intra" in probes[-1] else ""))
        if contend is not None:
            for c in contend(small_runs[-1]):
                contended.append(c)
                across = f" on each of {c['nodes']} nodes" if c.get("nodes", 1) > 1 else ""
                say(f"round {k + 1}: contention, {c['copies']} copies at batch {small} at once{across}: "
                    f"{c['factor']:.3f} times one alone")
        for r in ranks:
            m = runs.run(r, total_batch, f"check-r{r}-b{total_batch}-{k}")
            measured[r].append(m)
            say(f"round {k + 1}: check, {r} ranks, total batch {total_batch}: {m.iteration_s * 1e3:.3f} ms "
                f"(allreduce {m.allreduce_s * 1e3:.3f} ms)")
    fit = [(b, min(ts)) for b, ts in calibration_runs.items()]
    if probes:
        allreduce = min(probes, key=lambda a: a["seconds"])   # the least disturbed, as for the compute
        if "intra" in allreduce:                               # and within one node, its own least disturbed
            allreduce = {**allreduce, "intra": min((a["intra"] for a in probes), key=lambda a: a["seconds"])}
    if fit_comm:
        best = min(comm_runs, key=lambda m: m.iteration_s)
        allreduce = allreduce_from_run(best.ranks, best.allreduce_s, spec, platform.algorithm,
                                       after_step_s=best.iteration_s - best.allreduce_s)
    cal = calibrate(platform, spec, fit[0][0], fit[0][1], allreduce, more_runs=fit[1:])
    if contended:
        cal = cal.with_contention(contention_medians(contended))
    model = cal.apply(platform)
    rows = []
    for r in ranks:
        pred = predict_point(model, spec, r, total_batch, overlap=runs.overlap_allreduce)
        rows.append(CheckRow(r, total_batch, total_batch // r, pred.iteration_s, pred.comm_s,
                             [m.iteration_s for m in measured[r]], [m.allreduce_s for m in measured[r]],
                             pred.cycle_wait_s))
    return cal, rows
