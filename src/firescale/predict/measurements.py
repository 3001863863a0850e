"""Measured iteration times for calibration: read them from run records, or take a short single-rank run."""
from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from firescale.atomic import load_json
from firescale.cluster.ranks import RUN_TIMEOUT_S, SiteRanks, stop
from firescale.errors import FirescaleError
from firescale.results import RESULT_FORMAT, TrainResult, result_from_dict
from firescale.sweep.records import RUN_FORMAT
from firescale.train.options import TrainOptions, recorded_options, train_command

MIN_ITERATIONS = 5

@dataclass(frozen=True)
class MeasuredIteration:
    """One run's mean iteration (data wait + compute + allreduce, evaluation excluded), per rank."""

    source: str
    net: str
    dataset: str
    ranks: int
    batch_per_rank: int
    iteration_s: float
    data_wait_s: float
    compute_s: float
    allreduce_s: float
    iterations: int
    command: tuple[str, ...] = ()
    evaluations: int = 0        # evaluations the run made, and the seconds they took in all
    eval_s: float = 0.0
    options: dict[str, Any] = field(default_factory=dict, hash=False)   # the record's (train/options.py)

    def train_options(self) -> TrainOptions | None:
        """The options the run trained with: its record's, else its command line's as `firescale train` reads it
        (a record from before they were kept); None when it has neither; one sentence naming the record when
        they are not options the trainer takes."""
        return recorded_options(self.options, self.command, self.source)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "ranks": self.ranks, "batch_per_rank": self.batch_per_rank,
                "iteration_s": self.iteration_s, "data_wait_s": self.data_wait_s, "compute_s": self.compute_s,
                "allreduce_s": self.allreduce_s, "iterations": self.iterations, "evaluations": self.evaluations,
                "eval_s": self.eval_s}


def measured_from_result(result: TrainResult, source: str) -> MeasuredIteration:
    """The mean iteration of a trainer result, checked to be usable for calibration."""
    split = result.per_iteration
    if split.iterations < MIN_ITERATIONS:
        raise FirescaleError(f"{source}: per_iteration.iterations is {split.iterations}; calibration needs a run "
                             f"of at least {MIN_ITERATIONS} timed iterations")
    batch = result.batch
    if int(batch.get("iter_size", 1)) != 1:
        raise FirescaleError(f"{source}: batch.iter_size is {batch['iter_size']}; the performance model has no "
                             "gradient accumulation, so calibrate from a run with iter_size 1")
    try:
        per_rank = int(batch["batch_per_rank"])
    except (KeyError, TypeError, ValueError):
        raise FirescaleError(f"{source}: the train record's batch has no batch_per_rank") from None
    total = split.data_wait_s + split.compute_s + split.allreduce_s
    return MeasuredIteration(source, result.net, result.dataset, int(result.ranks), per_rank, total,
                             split.data_wait_s, split.compute_s, split.allreduce_s, int(split.iterations),
                             tuple(result.command), len(result.evals), sum(s.eval_s for s in result.segments),
                             dict(result.options))


def read_measured_iteration(path: str | Path) -> MeasuredIteration:
    """A run record (firescale.sweep.run/1, the trainer's result under "train") or a trainer result.json."""
    path = Path(path)
    data = load_json(path, "run record")
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == RUN_FORMAT:
        if data.get("outcome") != "succeeded" or not isinstance(data.get("train"), dict):
            raise FirescaleError(f"{path}: the run's outcome is {data.get('outcome')!r} with no train record; "
                                 "calibration needs a succeeded run")
        train = data["train"]
    elif fmt == RESULT_FORMAT:
        train = data
    else:
        raise FirescaleError(f"{path}: format {fmt!r} is neither {RUN_FORMAT!r} nor {RESULT_FORMAT!r}")
    return measured_from_result(result_from_dict(train, f"{path} train"), str(path))


def short_run_command(options: TrainOptions | None, batch_per_rank: int, iterations: int, out: Path,
                      reference_batch: int | None = None, where: str = "") -> list[str]:
    """The recorded run's `firescale train` as one short run at another per-rank batch, no eval or snapshot:
    its options, less those of where it goes, how long and to what it trains (its folder, batch, resume,
    target and layer profile).

    The learning rate is scaled linearly from `reference_batch` (the recorded run's batch) so that a
    smaller batch does not diverge before the timed iterations end; only the timing is used.
    """
    if options is None:
        raise FirescaleError(f"{where + ': ' if where else ''}the run record keeps neither its options nor a "
                             "`firescale train` command line to repeat; measure a second batch size with `firescale "
                             "train` and pass its record")
    short = replace(options, out=out, batch_per_rank=batch_per_rank, total_batch=None, resume=False, snapshot=None,
                    target=None, target_from=None, profile_layers=False,
                    lr_scaling="linear" if reference_batch else "none", reference_batch=reference_batch or None,
                    overrides=[*options.overrides, f"max_iter={iterations}", "test_interval=0",
                               "test_initialization=false", "snapshot=0", "snapshot_after_train=false",
                               f"display={iterations}"])
    return train_command(short, (sys.executable, "-m", "firescale"))   # --out last: copies each name their own


def _short_run_argv(baseline: MeasuredIteration, batch_per_rank: int, iterations: int, out: Path) -> list[str]:
    if baseline.ranks != 1:
        raise FirescaleError(f"{baseline.source}: a short calibration run repeats a single-rank baseline, "
                             f"not one of {baseline.ranks} ranks")
    return short_run_command(baseline.train_options(), batch_per_rank, iterations, out, baseline.batch_per_rank,
                             baseline.source)


def _start(argv: list[str], env: dict[str, str] | None = None, **options: Any) -> subprocess.Popen[str]:
    """A short run (or a step of copies of it) started in a session of its own, its output in one stream."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True, **options)


def _wait(argv: list[str], proc: subprocess.Popen[str], timeout: float) -> str:
    """The output of `proc`, which runs the short run `argv`; past `timeout` or when interrupted it is stopped
    with its whole process group (`stop`: no copy or rank of it left computing beside what runs next), and a
    timeout is an error saying so."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FirescaleError(f"the short calibration run ({' '.join(argv[3:])}) did not finish in {timeout:g} s "
                             "and was stopped") from None
    finally:
        stop(proc)
    return output


def _finish(argv: list[str], proc: subprocess.Popen[str], timeout: float) -> None:
    """Wait for `proc` (`_wait`); an error quoting its output when it fails."""
    output = _wait(argv, proc, timeout)
    if proc.returncode != 0:
        raise _short_run_failed(argv, proc, output)


def _short_run_failed(argv: list[str], proc: Any, output: str) -> FirescaleError:
    lines = output.strip().splitlines()
    tail = "\n".join([l for l in lines if l.startswith("firescale: error")] or lines[-5:])
    return FirescaleError(f"the short calibration run ({' '.join(argv[3:])}) failed with exit code "
                          f"{proc.returncode}: {tail}")


def short_run(baseline: MeasuredIteration, batch_per_rank: int, iterations: int, workdir: str | Path,
              *, timeout: float = RUN_TIMEOUT_S, repeat: int = 0) -> MeasuredIteration:
    """Run the baseline's own trainer command on one rank at `batch_per_rank` for `iterations` and read it
    back: into calibrate-b<batch>, a later repeat into calibrate-b<batch>-r<repeat> (as a point's repeats)."""
    out = Path(workdir) / (f"calibrate-b{batch_per_rank}" + (f"-r{repeat}" if repeat else ""))
    argv = _short_run_argv(baseline, batch_per_rank, iterations, out)
    _finish(argv, _start(argv), timeout)
    return read_measured_iteration(out / "result.json")


def mean_iteration(runs: Sequence[MeasuredIteration]) -> MeasuredIteration:
    """Repeats of one single-rank run (one batch a rank) as one: the mean of their iterations and of each
    part.  The same command's runs differ by as much as a point's prediction may miss by (on an idle machine,
    one rank alone took 25.8-28.4 ms an iteration over four back-to-back runs), so a calibration point
    measured once carries one run's luck; the report measures a point by its repeats' mean."""
    if not runs:
        raise FirescaleError("no runs to take the mean of")
    first = runs[0]
    for m in runs[1:]:
        if (m.ranks, m.batch_per_rank) != (first.ranks, first.batch_per_rank):
            raise FirescaleError(f"{m.source}: {m.ranks} rank(s) at batch {m.batch_per_rank} a rank is not a "
                                 f"repeat of {first.source} ({first.ranks} at {first.batch_per_rank})")
    if len(runs) == 1:
        return first
    mean = lambda attr: statistics.fmean(getattr(m, attr) for m in runs)  # noqa: E731
    return replace(first, source=f"mean of {len(runs)} runs: " + ", ".join(m.source for m in runs),
                   iteration_s=mean("iteration_s"), data_wait_s=mean("data_wait_s"), compute_s=mean("compute_s"),
                   allreduce_s=mean("allreduce_s"), iterations=sum(m.iterations for m in runs),
                   evaluations=sum(m.evaluations for m in runs), eval_s=sum(m.eval_s for m in runs))


def contention(alone: MeasuredIteration, baseline: MeasuredIteration, copies: int, iterations: int,
               workdir: str | Path, *, node: SiteRanks | None = None, nodes: int = 1,
               timeout: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """How much slower a rank computes when `copies` ranks share a node, measured, not fitted.

    `alone` is a short run of the net on one rank, or the mean of its repeats (mean_iteration; its compute:
    the iteration less its data wait);
    the same run is started `copies` times at once with no communication between them, and the ratio of
    their median compute to `alone`'s is the factor: what ranks take from each other through shared cores,
    caches and memory bandwidth.  Ranks sharing a node do not compute faster than one alone: a ratio below 1
    says the lone run was the disturbed one, and the factor is 1 (the ratio is kept as `ratio`).

    Without `node` the copies run here, each on its own core, as a site without a scheduler places its ranks;
    with it, as `copies` tasks of one job step on one of the site's nodes (SiteRanks.copies_argv), where they
    share what the node's ranks share; with `nodes` > 1, as many on each of that many nodes at once, sharing
    what a point's nodes share too (a host's caches and cores, where the nodes are slices of one machine).
    Horovod's share of a rank's core is not in it; the allreduce probe measures that.
    """
    if copies < 2:
        raise FirescaleError(f"a contention run needs 2 or more copies, not {copies}")
    if nodes > 1 and node is None:
        raise FirescaleError(f"copies on {nodes} nodes at once start through a site's srun; here is one node")
    root = Path(workdir) / (f"contention-b{alone.batch_per_rank}" + (f"-n{nodes}" if nodes > 1 else ""))
    argv = _short_run_argv(baseline, alone.batch_per_rank, iterations, root)[:-1]   # each copy adds its --out
    outs = [root.with_name(f"{root.name}-{i}") for i in range(copies * nodes)]
    if node is not None:
        step = _start(node.copies_argv(copies, argv, root, nodes=nodes), node.environment())
        output = _wait(argv, step, timeout)
        if step.returncode != 0:     # quote the first copy that left no result, from its own log
            failed = next((o for o in outs if not (o / "result.json").is_file()), outs[0])
            log = failed.with_name(failed.name + ".log")
            raise _short_run_failed(argv, step, (log.read_text() if log.is_file() else "") + output)
    else:
        _copies_on_cores(argv, outs, timeout)
    runs = [read_measured_iteration(out / "result.json") for out in outs]
    loaded = sorted(m.iteration_s - m.data_wait_s for m in runs)
    alone_s = alone.iteration_s - alone.data_wait_s
    ratio = statistics.median(loaded) / alone_s
    return {"factor": max(1.0, ratio), "ratio": ratio, "copies": copies, "nodes": nodes,
            "batch": alone.batch_per_rank, "alone_s": alone_s, "loaded_s": loaded}


def node_contentions(alone: MeasuredIteration, baseline: MeasuredIteration, copies: int, iterations: int,
                     workdir: str | Path, *, node: SiteRanks | None, nodes: Sequence[int],
                     timeout: float = RUN_TIMEOUT_S) -> list[dict[str, Any]]:
    """One round of `contention`: on one node and on each of the other node counts in `nodes` (more than one
    only through a site's srun, `node`; cluster.ranks.contention_nodes gives them), one measurement a count,
    fewest nodes first."""
    return [contention(alone, baseline, copies, iterations, workdir, node=node, nodes=n, timeout=timeout)
            for n in sorted(nodes)]


def contention_medians(measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rounds of `contention` (any order, several a node count) as one measurement a node count, fewest nodes
    first: the median of its rounds' factors, the rounds under `rounds`.  One round's copies can all be slowed
    together, by whatever else the machine does then (factors of 1.7 to 2.9 came out of single rounds of the
    same two copies on one core); the median of several does not follow one such round."""
    by_nodes: dict[int, list[dict[str, Any]]] = {}
    for c in measured:
        by_nodes.setdefault(c.get("nodes", 1), []).append(c)
    return [{"nodes": n, "factor": statistics.median(c["factor"] for c in by_nodes[n]), "rounds": by_nodes[n]}
            for n in sorted(by_nodes)]


def cores_for_copies(copies: int) -> list[int]:
    """The cores here that `copies` copies of a run are pinned to, one each: this process's, else (kept to fewer,
    as a test worker is) the machine's, as mpirun does; too few is an error (`predict calibrate` asks before
    its short runs start)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < copies:
        cores = list(range(os.cpu_count() or 1))
    if copies > len(cores):
        raise FirescaleError(f"a contention run here needs a core for each copy: {copies} copies, "
                             f"{len(cores)} cores")
    return cores


def _copies_on_cores(argv: list[str], outs: list[Path], timeout: float) -> None:
    """argv + [out] for each of `outs` at once, each pinned to a core of its own here."""
    cores = cores_for_copies(len(outs))
    # Each its own session folder for Open MPI: singletons starting at once race to create the shared one.
    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(tempfile.TemporaryDirectory(prefix="firescale-copy-")) for _ in outs]
        procs = [([*argv, str(out)], _start([*argv, str(out)], {"OMPI_MCA_orte_tmpdir_base": session},
                                            preexec_fn=lambda core=core: os.sched_setaffinity(0, {core})))
                 for out, core, session in zip(outs, cores, sessions)]
        try:
            for copy_argv, proc in procs:
                _finish(copy_argv, proc, timeout)
        finally:                                  # one copy failed or timed out: stop the others too
            for _, proc in procs:
                stop(proc)
