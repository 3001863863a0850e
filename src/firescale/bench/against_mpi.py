"""A framework's allreduce against MPI_Allreduce of the same bytes in the same run: one record, either framework."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from firescale.bench.allreduce_record import AllreduceMeasurement
from firescale.frameworks import MPI_ALLREDUCE, REGISTRY, Framework, by_algorithm


@dataclass(frozen=True)
class FrameworkVsMpi:
    """The trainer's allreduce of `framework` (over `process_group` where it names one) beside MPI_Allreduce of the
    same buffer, measured in the same run: medians, and the fastest repetitions (on a shared machine, the least
    disturbed); for a framework that calls its allreduce inside a graph, that call's own cost (`graph_call_s`)."""

    framework: Framework
    bytes: int
    ranks: int
    mpi_s: float
    framework_s: float
    mpi_min_s: float
    framework_min_s: float
    graph_call_s: float = 0.0
    process_group: str = ""

    @property
    def percent_of_mpi(self) -> float:
        """The framework's rate (bytes per second) in percent of MPI's: MPI's median time over the framework's."""
        return 100.0 * self.mpi_s / self.framework_s if self.framework_s > 0 else 0.0

    @property
    def best_percent_of_mpi(self) -> float:
        """The same from the fastest repetition of each."""
        return 100.0 * self.mpi_min_s / self.framework_min_s if self.framework_min_s > 0 else 0.0

    @property
    def in_graph_percent_of_mpi(self) -> float:
        """The rate with the graph call's own cost taken out (medians): the allreduce as a training step, which
        makes that call anyway, pays for it."""
        own = self.framework_s - self.graph_call_s
        return 100.0 * self.mpi_s / own if own > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """As `bench allreduce --json` has written it: the framework's times under its algorithm's name
        (`horovod_s`), the graph call where it makes one, the process group where it names one."""
        name = self.framework.algorithm
        shown: dict[str, Any] = {"bytes": self.bytes, "ranks": self.ranks, "mpi_s": self.mpi_s,
                                 f"{name}_s": self.framework_s, "mpi_min_s": self.mpi_min_s,
                                 f"{name}_min_s": self.framework_min_s}
        if self.framework.graph_call:
            shown["graph_call_s"] = self.graph_call_s
        if self.framework.names_process_group:
            shown["process_group"] = self.process_group
        shown |= {"percent_of_mpi": self.percent_of_mpi, "best_percent_of_mpi": self.best_percent_of_mpi}
        if self.framework.graph_call:
            shown["in_graph_percent_of_mpi"] = self.in_graph_percent_of_mpi
        return shown


def framework_vs_mpi(measurements: Sequence[AllreduceMeasurement]) -> list[FrameworkVsMpi]:
    """One comparison per framework measurement that has an `mpi` one of its size beside it, smallest size first,
    each size's in the order they were measured (a framework's process groups in turn)."""
    mpi = {m.bytes: m for m in measurements if m.algorithm == MPI_ALLREDUCE}
    ours = sorted(((m, f) for m in measurements if (f := by_algorithm(m.algorithm)) and m.bytes in mpi),
                  key=lambda pair: pair[0].bytes)
    return [FrameworkVsMpi(f, m.bytes, mpi[m.bytes].ranks, mpi[m.bytes].median_s, m.median_s, mpi[m.bytes].min_s,
                           m.min_s, m.graph_call_s, m.process_group) for m, f in ours]


def record(pairs: Sequence[FrameworkVsMpi]) -> dict[str, list[dict[str, Any]]]:
    """The comparisons under each framework's key of the JSON record (`horovod_vs_mpi`, `torch_vs_mpi`), every
    framework's key present, empty where it was not timed."""
    return {f"{f.algorithm}_vs_mpi": [p.to_dict() for p in pairs if p.framework is f] for f in REGISTRY.values()}


def table_lines(pairs: Sequence[FrameworkVsMpi]) -> list[str]:
    """Each framework's comparisons as a table: its rate in percent of MPI's, and where it names process groups
    or calls its allreduce in a graph, the group and the rate without that call."""
    lines = []
    for f in REGISTRY.values():
        mine = [p for p in pairs if p.framework is f]
        if not mine:
            continue
        group = f"{'group':>6} " if f.names_process_group else ""
        graph = f" {'graph call ms':>14} {'% without it':>13}" if f.graph_call else ""
        ms, rate = f"{f.library} ms", f"{f.library} % of MPI rate"
        wide, wider = max(11, len(ms)), max(22, len(rate))
        lines.append(f"{'KiB':>8} {group}{'MPI ms':>9} {ms:>{wide}} {rate:>{wider}} {'(fastest reps)':>15}{graph}")
        for p in mine:
            shown = f"{p.process_group:>6} " if f.names_process_group else ""
            beside = (f" {p.graph_call_s * 1e3:>14.3f} {p.in_graph_percent_of_mpi:>12.1f}%" if f.graph_call else "")
            lines.append(f"{p.bytes / 1024:>8.0f} {shown}{p.mpi_s * 1e3:>9.3f} {p.framework_s * 1e3:>{wide}.3f} "
                         f"{p.percent_of_mpi:>{wider - 1}.1f}% {p.best_percent_of_mpi:>14.1f}%{beside}")
        if f.graph_call:
            lines.append("graph call: the same call and wait with an identity in place of the allreduce, which a "
                         "training step pays once whatever its graph holds")
        else:
            lines.append(f"(the {f.name} trainer's Rank.sum{' over each process group' if group else ''})")
    return lines
