"""Fixed-epoch budgets (FireCaffe, footnote 4): each point's max_iter and LR schedule from its epochs and batch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from firescale.caffe.lr_policies import schedule_for_batch
from firescale.caffe.solver import SolverConfig
from firescale.errors import FirescaleError
from firescale.sweep.points import SweepPoint, phase_images

# Training-set sizes of datasets that sit on a site's filesystem without a firescale manifest.
KNOWN_TRAIN_IMAGES = {"ilsvrc12": 1_281_167}   # ILSVRC-2012, as FireCaffe and Caffe's ImageNet example train


@dataclass(frozen=True)
class Budget:
    """A point's training budget: its iterations, its epochs when the training-set size is known, and
    the solver keys the job overrides so that the schedule keeps its shape in epochs."""

    max_iter: int
    epochs: float | None
    overrides: dict[str, Any]

    def set_options(self) -> list[str]:
        """`--set key=value` options for `firescale train`, in a stable order."""
        out: list[str] = []
        for key in sorted(self.overrides):
            out += ["--set", f"{key}={_value(self.overrides[key])}"]
        return out


def _value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def point_budget(solver: SolverConfig, baseline_batch: int, point: SweepPoint, train_images: int | None,
                 where: str = "") -> Budget:
    """The point's max_iter: its stated epochs at its batch, else the solver's max_iter at the baseline
    batch scaled to its batch (baseline batch / batch); the schedule's iteration counts scale the same way.

    A point with a batch schedule trains the same images (epochs) as it would without: max_iter is the
    iteration at which its phases, each at its batch, have trained them, and the solver's schedule
    (stepsize, stepvalue, test_interval) is scaled for its first phase's batch and runs on in the same
    iterations after a change, as Caffe goes on when a run is continued at another batch."""
    ratio = baseline_batch / point.batch
    images: float
    if point.epochs is None:
        images = solver.max_iter * baseline_batch
    elif train_images is None:
        raise FirescaleError(f"experiment {point.experiment}: key 'epochs' ({point.epochs:g}) needs the training-set "
                             f"size{where}; ingest the dataset first, or leave the epochs to the solver's max_iter")
    else:
        images = point.epochs * train_images
    max_iter, trained = _iterations(point, images)
    overrides = schedule_for_batch(solver, ratio, max_iter)
    values = overrides.get("stepvalue", solver.stepvalue)
    if any(b <= a for a, b in zip(values, values[1:])):
        raise FirescaleError(f"experiment {point.experiment}: point {point.name}: at batch {point.batch} the solver's "
                             f"stepvalue {solver.stepvalue} rounds to {values}, which no longer increases; "
                             "use a smaller batch or farther apart stepvalues")
    epochs = trained / train_images if train_images else None
    return Budget(max_iter, epochs, overrides)


def _iterations(point: SweepPoint, images: float) -> tuple[int, int]:
    """The iterations that train `images` in the point's batch phases, and the images they train."""
    spent = phase_images(point, images)
    start, batch = point.phases[-1]
    last = round(spent[-1][1] / batch)
    if len(spent) > 1 and last < 1:
        end = sum(s / b for b, s in spent)
        raise FirescaleError(f"experiment {point.experiment}: point {point.name}: its batch schedule changes the batch "
                             f"to {batch} at iteration {start}, but its budget of {images:g} images ends at iteration "
                             f"{end:.0f}; change the batch earlier or give the point more epochs")
    max_iter = max(1, start + last)
    return max_iter, sum(round(s / b) * b for b, s in spent[:-1]) + (max_iter - start) * batch
