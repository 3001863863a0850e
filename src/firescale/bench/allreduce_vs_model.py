"""`firescale bench allreduce` as a whole: its options checked, the sizes it times, each measured allreduce set
beside what the cost models predict for it, the table and the JSON record."""
from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from firescale.atomic import atomic_write_json
from firescale.bench import against_mpi
from firescale.bench.allreduce import framework_last, measure_allreduce
from firescale.bench.allreduce_record import AllreduceMeasurement
from firescale.errors import FirescaleError
from firescale.frameworks import (
    BENCH_ALGORITHMS,
    FRAMEWORK_ALGORITHMS,
    MPI_ALLREDUCE,
    PROCESS_GROUPS,
    by_algorithm,
    framework,
)
from firescale.model.comm import Link, allreduce_time
from firescale.model.paleo import Platform

# The models each measured algorithm is predicted with, the first in `predicted_s`.  The point-to-point
# parameter server is Paleo's OneToAll as it runs; FireCaffe's Eq. 3 is shown beside it.
BENCH_MODELS = {"ps": ("ps", "firecaffe-ps")}
DEFAULT_SIZE_MB = 30.0     # NiN's |W|
SWEEP_BYTES = tuple(64 * 1024 * 4 ** k for k in range(6))   # 64 KiB, 256 KiB, 1 MiB, ... 64 MiB

Predicted = dict[str, float]   # seconds by cost model; empty without a link
Measured = list[tuple[AllreduceMeasurement, Predicted]]


@dataclass(frozen=True)
class AllreduceBench:
    """What is timed, and how: whose trainer's allreduce may be, the algorithms, repetitions per size, the
    synthetic step before each allreduce (0: none) and the images a rank it is fed, the compute that
    Horovod's overlapped requests start beside (0: not timed), and the process groups torch's is timed over,
    each in turn."""

    framework: str
    algorithms: tuple[str, ...]
    reps: int = 5
    compute_ms: float = 0.0
    batch_per_rank: int = 1
    overlap_ms: float = 0.0
    process_groups: tuple[str, ...] = ("auto",)


@dataclass(frozen=True)
class BenchSizes:
    """The bytes each algorithm reduces; with a net's gradients, their tensors (element counts) and the net;
    the input shape of the images fed to Horovod's iteration (the net's, else one pixel)."""

    sizes: tuple[int, ...]
    tensors: tuple[int, ...] = ()
    input_shape: tuple[int, ...] = (1, 1, 1)
    gradients_of: str | None = None


def allreduce_bench(framework_name: str, algorithms: str | None, *, reps: int = 5, compute_ms: float = 0.0,
                    batch_per_rank: int = 1, overlap_ms: float = 0.0,
                    process_groups: str | None = None) -> AllreduceBench:
    """The bench's options, checked: a framework firescale trains with, known algorithms (`bench_algorithms`),
    at least one repetition and one image a rank, no step or overlap below 0, a synthetic step only for a
    framework whose allreduce waits for a negotiation cycle (TensorFlow's), an overlap only beside an allreduce
    whose probe times it (Horovod's) after a step, and process groups (comma-separated) only for a framework
    that names them (torch's)."""
    chosen_framework = framework(framework_name)
    chosen = bench_algorithms(framework_name, algorithms)
    ours = chosen_framework.algorithm in chosen
    groups = bench_process_groups(process_groups, ours and chosen_framework.names_process_group)
    if reps < 1:
        raise FirescaleError("--reps must be at least 1")
    if not compute_ms >= 0:
        raise FirescaleError(f"--compute-ms must be 0 or more, not {compute_ms}")
    if batch_per_rank < 1:
        raise FirescaleError(f"--batch-per-rank must be at least 1, not {batch_per_rank}")
    if not overlap_ms >= 0:
        raise FirescaleError(f"--overlap-ms must be 0 or more, not {overlap_ms}")
    if compute_ms and not chosen_framework.negotiation_cycle:
        raise FirescaleError(f"--compute-ms runs a synthetic TensorFlow step; with --framework {framework_name} the "
                             "allreduces are timed on their own (leave --compute-ms out)")
    if overlap_ms and not (compute_ms > 0 and ours and chosen_framework.probe_overlap):
        raise FirescaleError("--overlap-ms times Horovod's allreduce beside compute: give --algorithms with horovod "
                             "and --compute-ms")
    return AllreduceBench(framework_name, tuple(chosen), reps, compute_ms, batch_per_rank, overlap_ms, groups)


def bench_process_groups(given: str | None, named: bool) -> tuple[str, ...]:
    """--process-groups (comma-separated, each one of frameworks.PROCESS_GROUPS; None: auto), checked: given only
    where the allreduce of a framework that names process groups is timed (`named`), each once."""
    if given is None:
        return ("auto",)
    if not named:
        others = [f for f in (by_algorithm(a) for a in FRAMEWORK_ALGORITHMS) if f and f.names_process_group]
        raise FirescaleError(f"--process-groups chooses what {' or '.join(f.algorithm for f in others)}'s allreduce "
                             f"sums over: give --framework {' or '.join(f.name for f in others)} with "
                             f"{' or '.join(f.algorithm for f in others)} among --algorithms")
    groups = tuple(dict.fromkeys(g.strip() for g in given.split(",") if g.strip()))
    unknown = [g for g in groups if g not in PROCESS_GROUPS]
    if unknown or not groups:
        raise FirescaleError(f"--process-groups {given!r}: {'unknown ' + ', '.join(unknown) if unknown else 'none'}; "
                             f"known: {', '.join(PROCESS_GROUPS)}")
    return groups


def bench_algorithms(framework_name: str, given: str | None) -> list[str]:
    """--algorithms (comma-separated; None: the framework's default), checked: known names, and of the
    frameworks' own allreduces only `framework_name`'s."""
    chosen = framework(framework_name)
    algorithms = [a.strip() for a in (given or ",".join(chosen.bench_default)).split(",") if a.strip()]
    unknown = [a for a in algorithms if a not in BENCH_ALGORITHMS]
    if unknown:
        raise FirescaleError(f"--algorithms: unknown {', '.join(unknown)}; known: {', '.join(BENCH_ALGORITHMS)}")
    other = [f for f in map(by_algorithm, algorithms) if f is not None and f is not chosen]
    if other:
        raise FirescaleError(f"--algorithms {other[0].algorithm} is another framework's allreduce than --framework "
                             f"{framework_name}'s ({chosen.algorithm}); give --framework {other[0].name} to time it")
    return algorithms


def bench_sizes(*, sweep: bool = False, sizes_mb: Sequence[float] | None = None, gradients_of: str | None = None,
                input_shape: tuple[int, int, int] | None = None, classes: int | None = None) -> BenchSizes:
    """What to reduce: one of the sweep (64 KiB to 64 MiB), sizes in MB (default 30) and a net's gradients
    (in the net's input shape and classes, which only it takes)."""
    given = [name for name, value in (("--sweep", sweep), ("--sizes-mb", sizes_mb),
                                      ("--gradients-of", gradients_of)) if value]
    if len(given) > 1:
        raise FirescaleError(f"give one of --sweep, --sizes-mb and --gradients-of, not {' and '.join(given)}")
    if (input_shape or classes is not None) and not gradients_of:
        raise FirescaleError("--input and --classes describe the net of --gradients-of; give it too")
    if gradients_of:
        from firescale.model.layers import net_cost
        from firescale.nets.zoo import get_net

        spec = get_net(gradients_of, num_classes=classes, input_shape=input_shape)
        cost = net_cost(spec, 1)
        return BenchSizes((cost.weight_bytes,), tuple(cost.gradient_tensors), tuple(spec.input_shape), gradients_of)
    if sweep:
        return BenchSizes(SWEEP_BYTES)
    return BenchSizes(tuple(int(mb * 1e6) for mb in (sizes_mb or [DEFAULT_SIZE_MB])))


def bench_link(platform: Platform | None, *, reduce_gbs: float | None = None,
               from_site: bool = False) -> tuple[Link | None, str]:
    """The link the measurements are predicted on, and the site's allreduce model: none without a platform
    (and 'tree'); a rank sums received gradients at `reduce_gbs`, else on a site's platform at its device's
    memory bandwidth / 3, else at no cost."""
    if platform is None:
        return None, "tree"
    link = platform.link
    if reduce_gbs:
        link = replace(link, reduce_rate=reduce_gbs * 1e9)
    elif from_site:
        link = replace(link, reduce_rate=platform.device.memory_bandwidth / 3)
    return link, platform.algorithm


def models_for(algorithm: str, site_algorithm: str, process_group: str = "") -> tuple[str, ...]:
    """The cost models a measured algorithm is set beside: its own (the site's for mpi and a framework's; for a
    framework that names process groups, that of the group it summed over, collectives.process_group_model:
    Gloo's ring, else the site's)."""
    measured = by_algorithm(algorithm)
    if measured is not None and measured.names_process_group:
        from firescale.cluster.collectives import process_group_model

        return (process_group_model(process_group, site_algorithm),)
    if algorithm == MPI_ALLREDUCE or measured is not None:
        return (site_algorithm,)
    return BENCH_MODELS.get(algorithm, (algorithm,))


def time_allreduces(comm: Any, bench: AllreduceBench, sizes: BenchSizes, link: Link | None, site_algorithm: str,
                    measure: Callable[..., AllreduceMeasurement] = measure_allreduce) -> Measured:
    """Each algorithm (a framework's own last; one that names process groups once per group) at each size, on
    every rank of `comm`, each beside its models' predictions on `link` (none without one)."""
    results: Measured = []
    named = framework(bench.framework)
    runs = [(algo, group) for algo in framework_last(list(bench.algorithms))
            for group in (bench.process_groups if by_algorithm(algo) is named and named.names_process_group
                          else ("auto",))]
    for algo, group in runs:
        for nbytes in sizes.sizes:
            ours = by_algorithm(algo)
            extra = {"process_group": group} if ours is not None and ours.names_process_group else {}
            m = measure(comm, algo, nbytes, bench.reps, compute_s=bench.compute_ms / 1e3, tensors=sizes.tensors,
                        batch=bench.batch_per_rank, input_shape=sizes.input_shape,
                        overlap_s=bench.overlap_ms / 1e3 if ours is not None and ours.probe_overlap else 0.0,
                        **extra)
            predicted = {model: allreduce_time(model, m.bytes, m.ranks, link)
                         for model in models_for(algo, site_algorithm, m.process_group)} if link else {}
            results.append((m, predicted))
    return results


def run_allreduce_bench(comm: Any, bench: AllreduceBench, sizes: BenchSizes, link: Link | None, site_algorithm: str,
                        *, json_path: str | None = None, say: Callable[[str], None] = print,
                        measure: Callable[..., AllreduceMeasurement] = measure_allreduce) -> Measured:
    """Time the allreduces (`time_allreduces`); rank 0 says the table and writes the JSON record to
    `json_path`, with the load average before and after and the Horovod knobs of the environment."""
    from firescale.cluster.horovod import recorded_knobs

    load_before = os.getloadavg()[0]
    results = time_allreduces(comm, bench, sizes, link, site_algorithm, measure)
    if comm.Get_rank() != 0:
        return results
    load = (load_before, os.getloadavg()[0])
    knobs = recorded_knobs(os.environ)
    for line in table_lines(comm.Get_size(), bench, sizes, results, knobs, load):
        say(line)
    if json_path:
        atomic_write_json(json_path, bench_record(comm.Get_size(), bench, sizes, link, results, knobs, load))
    return results


def table_lines(ranks: int, bench: AllreduceBench, sizes: BenchSizes, results: Measured, knobs: dict[str, str],
                load: tuple[float, float]) -> list[str]:
    """The bench's report: what was timed, each measurement beside each model's prediction, the share of an
    overlapped allreduce hidden, and each framework's allreduce against MPI_Allreduce of the same bytes."""
    named = framework(bench.framework)
    grouped = next((m.tensors for m, _ in results if m.tensors), 0)
    lines = [f"{ranks} ranks, {bench.reps} repetitions; times are the slowest rank's"
             + (f"; {named.library} sums {sizes.gradients_of}'s {grouped} gradients and the loss as "
                "one group" if grouped else "")
             + (f", after a {bench.compute_ms:g} ms step (the ranks' mean step subtracted)" if bench.compute_ms
                else ""),
             f"load average {load[0]:.2f} before, {load[1]:.2f} after (1 min) on {os.cpu_count()} cores; "
             + (f"{named.library} knobs: " + (" ".join(f"{k}={v}" for k, v in knobs.items())
                                              or f"{named.library}'s defaults")
                if named.site_knobs else f"framework {bench.framework}"),
             f"{'algorithm':<10} {'ranks':>5} {'MB':>8} {'median ms':>10} {'min ms':>9} {'model':>15} "
             f"{'predicted ms':>13} {'meas/pred':>10}"]
    for m, predicted in results:
        rows: list[tuple[str, float | None]] = list(predicted.items()) or [("-", None)]
        for model, pred in rows:
            ratio = f"{m.median_s / pred:.2f}" if pred else "-"
            name = f"{m.algorithm}/{m.process_group}" if m.process_group else m.algorithm
            lines.append(f"{name:<10} {m.ranks:>5} {m.bytes / 1e6:>8.3f} {m.median_s * 1e3:>10.3f} "
                         f"{m.min_s * 1e3:>9.3f} {model:>15} "
                         f"{(f'{pred * 1e3:.3f}' if pred is not None else '-'):>13} {ratio:>10}")
    for m, _ in results:
        if m.hidden_share is not None:
            lines.append(f"overlapped: Horovod's allreduce of {m.bytes / 1e6:.3f} MB started beside "
                         f"{m.window_s * 1e3:.3f} ms of compute added "
                         f"{statistics.fmean(m.overlapped_seconds) * 1e3:.3f} ms (mean), against "
                         f"{m.mean_s * 1e3:.3f} ms after the step: {m.hidden_share:.0%} of it ran beside the compute")
    return lines + against_mpi.table_lines(against_mpi.framework_vs_mpi([m for m, _ in results]))


def bench_record(ranks: int, bench: AllreduceBench, sizes: BenchSizes, link: Link | None, results: Measured,
                 knobs: dict[str, str], load: tuple[float, float]) -> dict[str, Any]:
    """The JSON record of a bench (`--json`): what was timed, on what, each measurement with its predictions."""
    named = framework(bench.framework)
    return {
        "ranks": ranks, "framework": bench.framework, "reps": bench.reps, "compute_ms": bench.compute_ms,
        "process_groups": (list(bench.process_groups) if named.names_process_group and named.algorithm
                           in bench.algorithms else []),
        "gradients_of": sizes.gradients_of,
        "load_average": list(load), "cpus": os.cpu_count(), "horovod_knobs": knobs,
        "link": None if link is None else {"bandwidth": link.bandwidth, "latency": link.latency,
                                           "ppp": link.ppp, "reduce_rate": link.reduce_rate},
        "measurements": [{**m.to_dict(), "predicted_s": next(iter(pred.values()), None),
                          "predicted_by_model": pred} for m, pred in results],
        **against_mpi.record(against_mpi.framework_vs_mpi([m for m, _ in results]))}
