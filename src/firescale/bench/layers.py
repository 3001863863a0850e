"""`firescale bench layers`: a layer profile of this machine's device (Paleo's profiled layers, model/profile.py).

Each net is built as the trainer builds it (bench/gpu_steps.build_model: Caffe's fillers, the trainer's SGD), on
the device a rank of the pytorch backend takes (the GPU, else one core), in the precision asked.  At each batch,
`warm_up` iterations run unmeasured, then `iterations` marked ones give every layer's median forward and backward
seconds inside a real iteration (the backend's `profile_layers`, the solver's update applied after each and timed
apart); then the same iterations run unmarked, through the trainer's own steps, for the whole iteration the layers
are held against; the peak memory comes with them.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from firescale.errors import FirescaleError
from firescale.frameworks import check_precision
from firescale.model.layers import net_cost
from firescale.model.profile import LayerProfile, ProfiledIteration, ProfiledLayer


@dataclass(frozen=True)
class LayersRequest:
    nets: tuple[str, ...]
    batches: tuple[int, ...]
    precision: str = "fp32"
    warm_up: int = 3
    iterations: int = 10

    def check(self) -> None:
        check_precision(self.precision)
        if not self.nets:
            raise FirescaleError("--nets: name at least one net")
        if not self.batches or min(self.batches) < 1:
            raise FirescaleError(f"--batches must be positive numbers, not {list(self.batches)}")
        if self.iterations < 1 or self.warm_up < 0:
            raise FirescaleError(f"--iterations must be at least 1 and --warm-up at least 0, not {self.iterations} "
                                 f"and {self.warm_up}")


def _nothing() -> None:
    return None


class TimedUpdates:
    """The update of a marked iteration: `solver` applies the gradients at iteration i, as in training, each
    application timed with the device synchronised before and after it; `reset()` forgets the warm-up's."""

    def __init__(self, solver: Any, base_lr: float, sync: Callable[[], None]) -> None:
        self.solver, self.base_lr, self.sync = solver, base_lr, sync
        self.seconds: list[float] = []

    def __call__(self, grads: list[Any], i: int) -> None:
        self.sync()
        start = time.perf_counter()
        self.solver.apply(grads, self.base_lr, i)
        self.sync()
        self.seconds.append(time.perf_counter() - start)

    def median_s(self, last: int) -> float:
        return statistics.median(self.seconds[-last:]) if self.seconds and last > 0 else 0.0


def profile_layers(request: LayersRequest, say: Callable[[str], None] = print) -> LayerProfile:
    """The profile of every net of `request` at every batch on this machine's device."""
    import torch

    from firescale.bench import gpu_steps
    from firescale.bench.gpu_check import git_commit
    from firescale.train.torch.backend import TorchBackend

    request.check()
    info = gpu_steps.device_info()
    layers: list[ProfiledLayer] = []
    iterations: list[ProfiledIteration] = []
    for name in request.nets:
        model = gpu_steps.build_model(name)
        backend = TorchBackend(request.precision)
        rank = backend.init_rank(1, 1)
        device = torch.device(model.rank.device)
        sync = partial(torch.cuda.synchronize, device) if device.type == "cuda" else _nothing
        for batch in request.batches:
            batches = gpu_steps.device_batches(model, batch, seed=batch)
            model.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            updates = TimedUpdates(model.solver, gpu_steps.BASE_LR, sync)
            timed = backend.profile_layers(model.net, *batches[0], rank, repeats=request.iterations,
                                           warm_up=request.warm_up, update=updates)[1:]   # less the data wait
            update_s = updates.median_s(request.iterations)
            by_name = {t.name: t for t in timed}
            cost = net_cost(model.spec, batch)
            for record in cost.layers:
                timing = by_name.get(record.name)
                if timing is None:
                    raise FirescaleError(f"net {name!r}: layer {record.name!r} ran no marked pass; the profile "
                                         "would leave it out")
                layers.append(ProfiledLayer.of(model.spec.name, record, timing))
            model.reset()
            steps, step = gpu_steps.trainer_side(model, request.precision)
            for i in range(request.warm_up):
                step(*batches[i % 2], i)
            timed_s, _ = gpu_steps.timed_iterations(step, batches, request.warm_up, request.iterations, device)
            peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0
            del steps
            model.reset()
            layers_s = sum(t.forward_s + t.backward_s for t in timed)
            iterations.append(ProfiledIteration(model.spec.name, batch, timed_s / request.iterations, layers_s,
                                                update_s, cost.params, peak))
            say(f"{model.spec.name} batch {batch}: iteration {1e3 * iterations[-1].iteration_s:.2f} ms, its layers "
                f"{1e3 * layers_s:.2f} ms, update {1e3 * update_s:.2f} ms")
    versions = {k: str(info[k]) for k in ("torch", "cuda", "cudnn", "driver", "python") if info.get(k)}
    return LayerProfile(str(info["name"]), request.precision, "pytorch", tuple(layers), tuple(iterations), versions,
                        git_commit() or "")
