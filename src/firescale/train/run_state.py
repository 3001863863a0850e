"""One training run's state across its segments: what a snapshot keeps, a resume reads back and the run record
reports, written and read by one pair of functions (`RunState.to_dict`, `RunState.from_dict`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from firescale.errors import FirescaleError
from firescale.results import EvalPoint, Segment
from firescale.train.checkpoint import trajectory_digest
from firescale.train.timing import SegmentClock, SplitSums


@dataclass
class RunState:
    """Where a run stands, and what it is.

    The first fields say what the run is; they stay the same in every segment (a resume checks them through
    `trajectory`, whose hash the snapshot keeps).  Then where the whole run has got to: the updates done, the
    training samples the data order has given out, the evaluations, the segments before this one and their
    per-iteration time sums.  Last, this segment's own: where it started, the images it trained on, its time
    sums, the hosts of its ranks and its clock (which counts the earlier segments' training time too).
    """

    net: str
    dataset_manifest_sha256: str
    solver_type: str
    ranks: int
    batch: dict[str, Any]           # the batch plan, every phase of it when the batch changes during the run
    trajectory: dict[str, Any]      # the settings that shape the run (checkpoint.trajectory_settings)
    read_limit_mbs: float | None    # --read-limit-mbs
    seed: int                       # the weights' fillers and dropout's masks
    data_seed: int                  # the training stream's shuffle
    iteration: int = 0              # updates done
    samples: int = 0                # training samples given out before `iteration` (all ranks)
    evals: list[EvalPoint] = field(default_factory=list)
    earlier: list[Segment] = field(default_factory=list)
    earlier_split: SplitSums = field(default_factory=SplitSums)
    start_iter: int = 0             # this segment's first update
    images: int = 0                 # training images of this segment (all ranks)
    split: SplitSums = field(default_factory=SplitSums)
    hostnames: list[str] = field(default_factory=list)
    clock: SegmentClock = field(default_factory=SegmentClock)

    def __post_init__(self) -> None:
        self.clock.prior_train_s = sum(s.train_s for s in self.earlier)

    # ------------------------------------------------------------ the loop's changes
    def updated(self, images: int) -> None:
        """One more update, of `images` training images."""
        self.iteration += 1
        self.images += images
        self.samples += images

    def evaluated(self, epoch: float, top1: float, top5: float, loss: float, seconds: float) -> EvalPoint:
        """An evaluation at this iteration that took `seconds` (of this segment's training time), kept."""
        self.clock.eval_s += seconds
        point = EvalPoint(iter=self.iteration, epoch=epoch, wall_s=self.clock.run_s(), top1=top1, top5=top5,
                          loss=loss, seconds=seconds)
        self.evals.append(point)
        return point

    def recorded(self, point: EvalPoint, seconds: float) -> None:
        """`point`'s evaluation took `seconds` more to write down: evaluation time too, not training time."""
        point.seconds += seconds
        self.clock.eval_s += seconds

    # ------------------------------------------------------------ what the record and the snapshot read
    def segment(self, status: str) -> Segment:
        """This segment so far, ending with `status`."""
        clock = self.clock
        return Segment(start_iter=self.start_iter, end_iter=self.iteration, startup_s=clock.startup_s,
                       train_s=clock.segment_s(), eval_s=clock.eval_s, images=self.images, status=status,
                       hostnames=self.hostnames)

    def segments(self, status: str) -> list[Segment]:
        """Every segment of the run, this one ending with `status`."""
        return [*self.earlier, self.segment(status)]

    def split_sums(self) -> SplitSums:
        """The per-iteration time sums of the whole run."""
        return self.earlier_split.plus(self.split)

    def to_dict(self, status: str) -> dict[str, Any]:
        """The run state as a snapshot keeps it (its .firescale.json), this segment ending with `status`."""
        return {
            "net": self.net, "dataset_manifest_sha256": self.dataset_manifest_sha256, "solver_type": self.solver_type,
            "seed": self.seed, "data_seed": self.data_seed, "start_sample": self.samples, "dropout_seed": self.seed,
            "ranks": self.ranks, "batch": self.batch, "iteration": self.iteration,
            "evals": [vars(e) for e in self.evals], "segments": [vars(s) for s in self.segments(status)],
            "split_sums": self.split_sums().to_dict(),
            "trajectory": self.trajectory, "trajectory_sha256": trajectory_digest(self.trajectory),
            "read_limit_mbs": self.read_limit_mbs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str, clock: SegmentClock | None = None,
                  hostnames: list[str] | None = None) -> RunState:
        """The state a snapshot's run state `data` (named `where`) resumes: the next segment starts at its
        iteration, on `clock` and `hostnames`.  Older firescale versions' keys are read as they wrote them
        (no read limit, evaluations without their seconds, time sums without whole iterations)."""
        try:
            trajectory = data["trajectory"]
            iteration, seed = int(data["iteration"]), int(data["seed"])
            state = cls(
                net=data.get("net", trajectory["net"]),
                dataset_manifest_sha256=data.get("dataset_manifest_sha256", trajectory["dataset_manifest_sha256"]),
                solver_type=data.get("solver_type", trajectory["solver"]["type"]),
                ranks=int(data.get("ranks", trajectory["batch"].get("ranks", 0))),
                batch=data.get("batch", trajectory["batch"]), trajectory=trajectory,
                read_limit_mbs=data.get("read_limit_mbs"), seed=seed, data_seed=int(data.get("data_seed", seed)),
                iteration=iteration, samples=int(data["start_sample"]),
                evals=[EvalPoint(**e) for e in data.get("evals", [])],
                earlier=[Segment(**s) for s in data.get("segments", [])],
                earlier_split=SplitSums(**data["split_sums"]) if "split_sums" in data else SplitSums(),
                start_iter=iteration, hostnames=list(hostnames or []), clock=clock or SegmentClock())
        except KeyError as exc:
            raise FirescaleError(f"{where}: the run state has no {exc.args[0]!r}, so the run cannot resume from "
                                 "it; train in a new --out folder") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise FirescaleError(f"{where}: the run state is not one firescale train writes ({exc}); train in a "
                                 "new --out folder") from None
        return state
