"""`firescale train` beside a bare loop of the same framework, net, batch, ranks and solver: images/s, side by side.

The bare loop is what a user of that framework would write: Horovod's TensorFlow (bench/bare_loop.py) or
plain PyTorch over the same process group (bench/bare_loop_torch.py)."""
from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from firescale.atomic import load_json
from firescale.cluster.ranks import SiteRanks
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, REGISTRY

TRAINER_FORMAT = "firescale.bench.trainer/1"
_DISPLAY_LOSS = re.compile(r"^iter (\d+)/\d+ loss (\S+)", re.M)


@dataclass(frozen=True)
class SideRun:
    """One run of one side: images/s, and the training loss of its last iteration (the same arithmetic
    on the same first batches gives the same loss on both sides)."""

    images_per_s: float
    last_loss: float


@dataclass(frozen=True)
class TrainerBenchRuns:
    """How to start both sides as a site starts ranks: dataset, net, solver, per-rank batch, timed iterations."""

    dataset: Path
    net: str
    solver: Path
    batch_per_rank: int
    iterations: int
    workdir: Path
    ranks: SiteRanks
    timeout: float = 900.0
    framework: str = DEFAULT_FRAMEWORK   # firescale.frameworks: the trainer's backend and the bare loop's
    process_group: str = "auto"     # both sides' process group, where the framework names one (PROCESS_GROUPS)

    def _group(self) -> list[str]:
        return ["--process-group", self.process_group] if REGISTRY[self.framework].names_process_group else []

    def trainer(self, ranks: int, name: str) -> SideRun:
        """images/s of `firescale train` (its result.json: images over training time, evaluation excluded)."""
        out = self.workdir / name
        cmd = [sys.executable, "-m", "firescale", "train", "--dataset", str(self.dataset), "--net", self.net,
               "--solver", str(self.solver), "--batch-per-rank", str(self.batch_per_rank), "--out", str(out),
               "--set", f"max_iter={self.iterations}", "--set", "test_interval=0", "--set", "snapshot=0",
               "--set", "snapshot_after_train=false", "--set", f"display={self.iterations}",
               "--framework", self.framework, *self._group()]
        stdout = self.ranks.run(ranks, cmd, f"firescale train ({name})", timeout=self.timeout)
        shown = [(int(i), float(loss)) for i, loss in _DISPLAY_LOSS.findall(stdout)]
        if not shown or shown[-1][0] != self.iterations:
            raise FirescaleError(f"firescale train ({name}) printed no loss at iteration {self.iterations}")
        result = load_json(out / "result.json")
        if result["ranks"] != ranks or result["iterations"] != self.iterations:
            raise FirescaleError(f"{out / 'result.json'}: {result['iterations']} iterations on "
                                 f"{result['ranks']} ranks, "
                                 f"expected {self.iterations} on {ranks}")
        return SideRun(float(result["images_per_s"]), shown[-1][1])

    def bare(self, ranks: int, name: str) -> SideRun:
        """images/s of the framework's bare loop (the registry's `bare_loop`)."""
        chosen = REGISTRY[self.framework]
        module, what = chosen.bare_loop, chosen.bare_loop_label
        out = self.workdir / f"{name}.json"
        cmd = [sys.executable, "-m", module, "--dataset", str(self.dataset), "--net", self.net,
               "--solver", str(self.solver), "--batch-per-rank", str(self.batch_per_rank),
               "--iterations", str(self.iterations), "--json", str(out), *self._group()]
        self.ranks.run(ranks, cmd, f"{what} ({name})", timeout=self.timeout)
        result = load_json(out)
        if result["ranks"] != ranks:
            raise FirescaleError(f"{out}: the bare loop ran on {result['ranks']} ranks, expected {ranks}")
        return SideRun(float(result["images_per_s"]), float(result["final_loss"]))


@dataclass
class TrainerVsBare:
    """One rank count: images/s of the trainer and of the bare loop, one of each per round."""

    ranks: int
    batch_per_rank: int
    framework: str = DEFAULT_FRAMEWORK
    trainer: list[float] = field(default_factory=list)     # images/s, one per round
    bare: list[float] = field(default_factory=list)
    trainer_loss: float | None = None                       # the last iteration's loss, last round
    bare_loss: float | None = None

    @property
    def percent(self) -> float:
        """The trainer's median images/s in percent of the bare loop's."""
        return 100.0 * statistics.median(self.trainer) / statistics.median(self.bare)

    @property
    def best_percent(self) -> float:
        """The same from each side's fastest run (on a shared machine, the least disturbed)."""
        return 100.0 * max(self.trainer) / max(self.bare)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "percent": self.percent, "best_percent": self.best_percent}


def compare_trainer(runs: TrainerBenchRuns, ranks: Sequence[int], repeats: int,
                    say: Callable[[str], None] = lambda s: None) -> list[TrainerVsBare]:
    """`repeats` rounds; in each, for every rank count, the trainer and the bare loop back to back (their
    order alternating between rounds), so that the machine's load touches both sides alike."""
    if repeats < 1 or not ranks or min(ranks) < 1:
        raise FirescaleError(f"need repeats >= 1 and rank counts >= 1, not {repeats} and {list(ranks)}")
    rows = {r: TrainerVsBare(r, runs.batch_per_rank, runs.framework) for r in ranks}
    for k in range(repeats):
        for r in ranks:
            sides = [("trainer", runs.trainer), ("bare", runs.bare)]
            for side, run in (sides if k % 2 == 0 else sides[::-1]):
                got = run(r, f"{side}-r{r}-{k}")
                getattr(rows[r], side).append(got.images_per_s)
                setattr(rows[r], f"{side}_loss", got.last_loss)
                say(f"round {k + 1}, {r} ranks: {side} {got.images_per_s:.0f} images/s, last loss {got.last_loss:.4f}")
    return [rows[r] for r in ranks]
