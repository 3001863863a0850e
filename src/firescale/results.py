"""Training result records (result.json): dataclasses, atomic writing, reading with clear errors."""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json, load_json
from firescale.errors import FirescaleError

RESULT_FORMAT = "firescale.train.result/1"


@dataclass
class EvalPoint:
    """One evaluation on the whole test set; wall_s counts training time since the start (all segments),
    seconds what this evaluation took (0: a record from before they were kept)."""

    iter: int
    epoch: float
    wall_s: float
    top1: float
    top5: float
    loss: float
    seconds: float = 0.0


@dataclass
class Segment:
    """One launch of the job (a resumed run has several): its iterations and where its time went."""

    start_iter: int
    end_iter: int
    startup_s: float      # process start to training start (init, data open, graph tracing)
    train_s: float        # training start to stop, eval included (what time-to-accuracy counts)
    eval_s: float         # of which evaluating
    images: int           # training images processed in this segment (all ranks)
    status: str           # finished | target_reached | interrupted
    hostnames: list[str] = field(default_factory=list)


@dataclass
class IterationSplit:
    """Mean seconds per iteration spent waiting for data, computing, and in the gradient allreduce; the three
    add up to the mean iteration.  The data wait is timed on every iteration; compute and allreduce apart
    only on `split_iterations` of them (every `split_every`-th, and a segment's first), which run their
    parts with the host waiting between them; the rest run whole, as one graph.  Compute and allreduce
    divide the mean iteration less its data wait in the proportion of their sums over the iterations
    timed in parts.  Results without the two counts timed every iteration in parts."""

    data_wait_s: float
    compute_s: float
    allreduce_s: float
    iterations: int
    split_iterations: int | None = None
    split_every: int = 1


@dataclass
class TrainResult:
    """Everything one training run reports; written by rank 0 as RUNDIR/result.json."""

    net: str
    dataset: str
    dataset_manifest_sha256: str
    ranks: int
    solver: dict[str, Any]
    batch: dict[str, Any]
    seed: int
    data_seed: int
    target_top1: float | None
    target_source: str
    reached_target: bool
    time_to_accuracy_s: float | None
    train_time_s: float
    iterations: int
    epochs: float
    images_per_s: float
    per_iteration: IterationSplit
    allreduce: dict[str, Any]
    hostnames: list[str]
    versions: dict[str, str | None]
    evals: list[EvalPoint]
    segments: list[Segment]
    status: str
    command: list[str] = field(default_factory=list)
    # the run's options as the trainer resolved them (train/options.py, record_options); {}: a record from before
    # they were kept, whose `command` says them
    options: dict[str, Any] = field(default_factory=dict)
    layer_trace: str | None = None  # RUNDIR-relative layer-wise trace (--profile-layers)
    placement: dict[str, Any] | None = None  # a net split by layers: devices, boundaries, measured copies
    net_file: dict[str, str] | None = None   # a Caffe net file trained: its absolute path and sha256 at the start
    test_net_file: dict[str, str] | None = None   # the solver's test_net, when it names one: path and sha256 alike
    read_limit_mbs: float | None = None      # --read-limit-mbs: each rank's training reads slowed to this MB/s
    format: str = RESULT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def final_top1(self) -> float | None:
        return self.evals[-1].top1 if self.evals else None


def file_record(path: str | Path, sha256: str | None = None) -> dict[str, str]:
    """A file as a run record names it (`net_file`, `test_net_file`): its absolute path and its sha256, read
    now unless given."""
    import hashlib

    path = Path(path).resolve()
    return {"path": str(path), "sha256": sha256 or hashlib.sha256(path.read_bytes()).hexdigest()}


def write_result(path: str | Path, result: TrainResult) -> Path:
    """Write `result` as key-sorted JSON, atomically."""
    return atomic_write_json(path, result.to_dict())


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise FirescaleError(f"{where}: expected an object, found {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    required = [f.name for f in fields(cls)
                if f.name not in data and f.default is MISSING and f.default_factory is MISSING]
    if required:
        raise FirescaleError(f"{where}: missing key {required[0]!r}")
    unknown = sorted(set(data) - names)
    if unknown:
        raise FirescaleError(f"{where}: unknown key {unknown[0]!r}")
    return cls(**{k: v for k, v in data.items()})


def result_from_dict(data: dict[str, Any], where: str = "result") -> TrainResult:
    """Rebuild a TrainResult from its JSON form, naming the first missing or unknown key."""
    result = _build(TrainResult, data, where)
    if result.format != RESULT_FORMAT:
        raise FirescaleError(f"{where}: format {result.format!r} is not {RESULT_FORMAT!r}")
    result.per_iteration = _build(IterationSplit, result.per_iteration, f"{where} per_iteration")
    result.evals = [_build(EvalPoint, e, f"{where} evals[{i}]") for i, e in enumerate(result.evals)]
    result.segments = [_build(Segment, s, f"{where} segments[{i}]") for i, s in enumerate(result.segments)]
    return result


def read_result(path: str | Path) -> TrainResult:
    """Read a result.json written by `firescale train`."""
    return result_from_dict(load_json(path, "result file"), str(path))


def baseline_top1(paths: str | Path | list[str] | list[Path]) -> float:
    """The top-1 accuracy a baseline ended with (its last evaluation), the target for scaled runs; for
    several repeats of the baseline, the mean of theirs."""
    given: list[str | Path] = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    if not given:
        raise FirescaleError("no baseline result to take the target accuracy from")
    finals = []
    for path in given:
        result = read_result(path)
        if result.final_top1 is None:
            raise FirescaleError(f"baseline result {path} has no evaluation points, so it gives no target accuracy")
        finals.append(float(result.final_top1))
    return sum(finals) / len(finals)
