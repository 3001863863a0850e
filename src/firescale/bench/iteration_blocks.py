"""An allreduce's cost to an iteration: iterations with it timed in blocks that alternate with as many without it."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

ITERATION_BLOCK = 10    # repetitions with the allreduce, then as many without, in turn

Kind = Callable[[], None]


def alternating_blocks(comm: Any, pairs: Sequence[tuple[Kind, Kind]], reps: int, warmup: int = 1
                       ) -> list[tuple[list[float], list[float]]]:
    """For each (timed kind, the kind alone it is measured against) of `pairs`: `reps` calls of the first, in
    blocks of ITERATION_BLOCK that alternate with as many of the second; per repetition what the first added to
    the ranks' iteration, and per block the ranks' mean median iteration of the second (`allreduce_costs`).
    The iteration with the allreduce after its step is measured against the step; the allreduce beside a
    window of compute against that window."""
    import numpy as np

    for _ in range(warmup):
        for kind, alone_kind in pairs:
            alone_kind()
            kind()
    blocks = -(-reps // ITERATION_BLOCK)
    timed, alone_t = np.zeros((len(pairs), reps)), np.zeros((len(pairs), blocks))
    comm.Barrier()
    for b in range(blocks):
        for k, (kind, alone_kind) in enumerate(pairs):
            alone = []
            for _ in range(ITERATION_BLOCK):
                start = time.perf_counter()
                alone_kind()
                alone.append(time.perf_counter() - start)
            alone_t[k, b] = statistics.median(alone)
            kind()      # untimed: the ranks come out of their blocks alone at different times
            for rep in range(b * ITERATION_BLOCK, min(reps, (b + 1) * ITERATION_BLOCK)):
                start = time.perf_counter()
                kind()
                timed[k, rep] = time.perf_counter() - start
    # Gathered once, after the timed calls (bench/mpi_algorithms.time_back_to_back says why).
    costs = []
    for k in range(len(pairs)):
        with_all, alone_all = np.empty((comm.Get_size(), reps)), np.empty((comm.Get_size(), blocks))
        comm.Allgather(np.ascontiguousarray(timed[k]), with_all)
        comm.Allgather(np.ascontiguousarray(alone_t[k]), alone_all)
        costs.append(allreduce_costs(with_all, alone_all))
    return costs


def allreduce_costs(with_t: Any, without_t: Any) -> tuple[list[float], list[float]]:
    """Per repetition, the ranks' mean iteration with the allreduce less their mean iteration without it
    in the same block; and those means, per block.  `with_t` is (ranks, repetitions) seconds, `without_t`
    (ranks, blocks of ITERATION_BLOCK repetitions).

    The mean over the ranks, not the slowest rank: the allreduce holds the ranks in step, so over a run
    each rank spends the same time, but where one repetition ends and the next begins differs by rank
    (each rank's thread wakes when its core lets it), and a long repetition on one rank is a short one on
    the other.  The slowest rank's time per repetition then counts that jitter as cost, where the trainer's
    mean iteration, the figure the probe predicts, pays none of it (docs/benchmarks/2026-11-25-xeon-cycle.md,
    "The probe averaged its ranks wrongly")."""
    import numpy as np

    with_mean = np.mean(np.asarray(with_t, dtype=float), axis=0)
    steps = np.mean(np.asarray(without_t, dtype=float), axis=0)
    seconds = [float(with_mean[rep] - steps[rep // ITERATION_BLOCK]) for rep in range(len(with_mean))]
    return seconds, [float(x) for x in steps]
