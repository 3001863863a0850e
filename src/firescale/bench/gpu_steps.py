"""Images/s and peak memory of the trainer's PyTorch steps beside a bare PyTorch loop, on batches kept on the device.

For each net, batch and precision, two sides train the same CaffeNet from the same weights on the same two
random batches (NHWC arrays copied through TorchSteps.batch, so both see the trainer's channels-last layout):

- trainer: firescale.train.torch.backend.TorchSteps.iteration on one rank (gradients, the rank's sum, Caffe's
  SGD update), exactly as `firescale train` calls it between its host reads;
- bare: what a PyTorch user writes: forward, F.cross_entropy, loss.backward(), torch.optim.SGD.step().

Both sides run under the backend's precision settings (fp32: TF32 off; tf32: on; bf16: autocast) and
init_rank's cuDNN settings (deterministic kernels, no benchmark search).  Each side warms up, then
`iterations` are timed with CUDA events (on a CPU: the host clock); torch.cuda.max_memory_allocated gives
its peak.  A combination that would pass the deadline is skipped and says so.  Run it alone:

    python -m firescale.bench.gpu_steps --json steps.json --nets alexnet,nin --batches 64 --precisions fp32,bf16
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

GPU_STEPS_FORMAT = "firescale.bench.gpu_steps/1"
# The nets of the check: Caffe's own files where nets/caffe_zoo ships one, firescale's zoo otherwise (NiN and
# VGG-16 were not available as their published files: nets/caffe_zoo/README.md).
NETS = {"alexnet": "caffe_zoo:bvlc_alexnet/train_val.prototxt", "nin": "nin", "resnet50": "resnet50",
        "vgg16": "vgg16"}
SMOKE_NETS = {"lenet": "lenet_same", "cifar10_quick": "cifar10_quick"}
# Both sides' solver: Caffe's ImageNet solvers' SGD at a fixed rate.
BASE_LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 0.0005


@dataclass
class SideTiming:
    """One side of one combination: how long `iterations` took and the memory it peaked at."""

    net: str
    batch: int
    precision: str
    side: str                        # trainer or bare
    status: str                      # ok, out of memory, skipped: why, failed: why
    iterations: int = 0
    seconds: float = 0.0
    images_per_s: float = 0.0
    peak_bytes: int = 0              # torch.cuda.max_memory_allocated over warm-up and timed iterations
    start_bytes: int = 0             # allocated before the side started: weights, the trainer solver's history,
                                     # the batches, and the copy of the starting state the sides are reset to
    loss: float | None = None        # the last iteration's mean loss
    warm_up_s: float = 0.0


def device_info() -> dict[str, Any]:
    """The device, driver and library versions a result was measured with (None where not known here)."""
    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": None, "device": "cpu", "name": platform.processor() or platform.machine(), "driver": None,
        "capability": None, "memory_bytes": None, "multiprocessors": None, "bf16": None,
        "cpu_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
    }
    if not cuda:
        return info
    props = torch.cuda.get_device_properties(0)
    nccl = torch.cuda.nccl.version() if dist.is_nccl_available() else None
    info.update(device="cuda:0", name=props.name, capability=f"{props.major}.{props.minor}",
                memory_bytes=int(props.total_memory), multiprocessors=int(props.multi_processor_count),
                bf16=bool(torch.cuda.is_bf16_supported()),
                nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
    return info


# ------------------------------------------------------------ nets
def _spec(name: str) -> Any:
    from firescale.nets.zoo import caffe_zoo_file, get_net

    where = {**NETS, **SMOKE_NETS}.get(name, name)
    if where.startswith("caffe_zoo:"):
        return get_net(str(caffe_zoo_file(where.split(":", 1)[1])))
    return get_net(where)


@dataclass
class Model:
    """One net on the rank's device with the trainer's solver, and everything a side needs to train it."""

    name: str
    spec: Any
    net: Any
    solver: Any
    rank: Any
    history_bytes: int
    initial: list[torch.Tensor]      # the blobs and the solver's history as built: each side starts from them

    def reset(self) -> None:
        """The blobs and the solver's history back to what they were when built; no gradient kept."""
        with torch.no_grad():
            for tensor, value in zip(self.state, self.initial):
                tensor.copy_(value)
        for p in self.net.params:
            p.grad = None

    @property
    def state(self) -> list[torch.Tensor]:
        return [*self.net.params, *self.solver.history, *self.solver.update_history]


def build_model(name: str, seed: int = 1) -> Model:
    """The net from Caffe's fillers on the rank's device (init_rank: the GPU, else one core) and its CaffeSolver
    with the lr and decay multipliers the trainer would take from the net's file."""
    from firescale.caffe.solver import SolverConfig
    from firescale.train.net_file import blob_multipliers, net_file_settings
    from firescale.train.torch.backend import TorchBackend

    spec = _spec(name)
    backend = TorchBackend("fp32")
    rank = backend.init_rank(1, 1)
    settings = net_file_settings(spec)
    net = backend.build_net(spec, seed, None, settings.moving_average if settings else None)
    config = SolverConfig(base_lr=BASE_LR, type="SGD", lr_policy="fixed", momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY)
    lr_mults, decay_mults = blob_multipliers(spec, net.infos, settings, config, Path("gpu_steps"))
    solver = backend.make_solver(config, net, [i.name for i in net.infos], lr_mults, decay_mults)
    history = sum(h.numel() * h.element_size() for h in [*solver.history, *solver.update_history])
    model = Model(name, spec, net, solver, rank, history, [])
    model.initial = [t.detach().clone() for t in model.state]
    return model


def device_batches(model: Model, batch: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two random batches (never zeros) through the trainer's own copy to the device (TorchSteps.batch: pinned
    memory on a GPU, NCHW views of NHWC data), shared by both sides."""
    from firescale.train.torch.backend import TorchSteps

    steps = TorchSteps(model.net, model.solver, model.rank, None, None)
    rng = np.random.default_rng(seed)
    h, w, c = model.spec.input_shape
    return [steps.batch(rng.standard_normal((batch, h, w, c), np.float32),
                        rng.integers(0, model.spec.num_classes, batch).astype(np.int64)) for _ in range(2)]


def trainer_side(model: Model, precision: str) -> tuple[Any, Callable[..., torch.Tensor]]:
    """The trainer's steps in `precision` (the backend sets TF32 and autocast) and one iteration of them, which
    returns the summed (loss, stop flag) pair as the trainer gets it, on the device."""
    from firescale.train.torch.backend import TorchBackend

    backend = TorchBackend(precision)
    backend.init_rank(1, 1)
    steps = backend.make_steps(model.net, model.solver, model.rank, model.spec.input_shape, overlap=False)

    def iteration(images: torch.Tensor, labels: torch.Tensor, i: int) -> torch.Tensor:
        return steps.iteration(images, labels, (1, i), BASE_LR, i, int(labels.shape[0]), 0.0)
    return steps, iteration


def bare_side(model: Model, precision: str) -> tuple[torch.optim.Optimizer, Callable[..., torch.Tensor]]:
    """What a user writes: forward (autocast in bf16), the mean cross-entropy, backward, torch's SGD with a
    parameter group per (lr_mult, decay_mult) of the net's file.  With a fixed rate this is Caffe's SGD
    (h = m h + rate (g + decay w) and torch's buf = m buf + g + decay w, w -= rate buf, are the same update),
    so both sides' losses agree up to rounding."""
    groups: dict[tuple[float, float], list[torch.Tensor]] = {}
    for p, keep, lr_mult, decay_mult in zip(model.net.params, model.net.learnt, model.solver.lr_mults,
                                            model.solver.decay_mults):
        if keep:
            groups.setdefault((lr_mult, decay_mult), []).append(p)
    optimizer = torch.optim.SGD([{"params": params, "lr": BASE_LR * lr_mult, "weight_decay": WEIGHT_DECAY * decay_mult}
                                 for (lr_mult, decay_mult), params in groups.items()], lr=BASE_LR, momentum=MOMENTUM)
    device = model.net.params[0].device
    generator = torch.Generator(device=device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())

    def iteration(images: torch.Tensor, labels: torch.Tensor, i: int) -> torch.Tensor:
        generator.manual_seed(1 << 32 | i)      # dropout's masks as the trainer draws them: seed 1, iteration i
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model.net(images, training=True, dropout_generator=generator)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return optimizer, iteration


# ------------------------------------------------------------ timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_iterations(step: Callable[..., torch.Tensor], batches: list[Any], first: int, count: int,
           device: torch.device) -> tuple[float, torch.Tensor]:
    """Seconds of `count` iterations from iteration `first` (CUDA events on a GPU), and the last loss."""
    _sync(device)
    loss = torch.zeros(())
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(first, first + count):
            loss = step(*batches[i % 2], i)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, loss
    t0 = time.perf_counter()
    for i in range(first, first + count):
        loss = step(*batches[i % 2], i)
    return time.perf_counter() - t0, loss


def time_side(model: Model, side: str, precision: str, batches: list[Any], iterations: int, warm_up: int,
              seconds_left: float) -> SideTiming:
    """One side from the net as built: warm-up iterations (the last one timed alone to size the run), then
    `iterations` timed, fewer (at least 3) or none when they would take more than `seconds_left`."""
    device = torch.device(model.rank.device)
    batch = int(batches[0][1].shape[0])
    row = SideTiming(model.name, batch, precision, side, "ok")
    if seconds_left <= 0:
        row.status = "skipped: its net's share of the deadline was spent"
        return row
    model.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        row.start_bytes = int(torch.cuda.memory_allocated(device))
    keep: Any = None
    try:
        keep, step = trainer_side(model, precision) if side == "trainer" else bare_side(model, precision)
        t0 = time.perf_counter()
        for i in range(max(warm_up - 1, 0)):
            step(*batches[i % 2], i)
        _sync(device)
        row.warm_up_s = time.perf_counter() - t0
        one, _ = timed_iterations(step, batches, warm_up, 1, device)
        fit = int((seconds_left - row.warm_up_s) / max(one, 1e-9))
        if fit < 3:
            row.status = (f"skipped: one iteration took {one:.3f} s, and {max(seconds_left, 0):.1f} s were this "
                          "side's share of the deadline")
            return row
        row.iterations = min(iterations, fit)
        row.seconds, loss = timed_iterations(step, batches, warm_up + 1, row.iterations, device)
        row.images_per_s = row.iterations * batch / row.seconds
        row.loss = float(loss[0]) / batch if side == "trainer" else float(loss)
    except torch.cuda.OutOfMemoryError:
        row.status = "out of memory"
    except RuntimeError as exc:        # e.g. a kernel a precision lacks on this device: recorded, not fatal
        row.status = f"failed: {str(exc).splitlines()[0][:200]}"
    finally:
        if device.type == "cuda":
            row.peak_bytes = int(torch.cuda.max_memory_allocated(device))
        del keep
        model.reset()
    return row


def count_syncs(model: Model, precision: str, batch: int) -> dict[str, int]:
    """Host-device synchronisations in one iteration of each side, as torch's sync debug mode reports them
    (a GPU only; each one stalls the host until the device has caught up)."""
    out: dict[str, int] = {}
    if torch.device(model.rank.device).type != "cuda":
        return out
    images, labels = device_batches(model, batch, seed=0)[0]
    for side in ("trainer", "bare"):
        _, step = trainer_side(model, precision) if side == "trainer" else bare_side(model, precision)
        step(images, labels, 0)            # first-call work (allocations, cuDNN's choices) outside the count
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step(images, labels, 1)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        out[side] = sum("synchroniz" in str(w.message) for w in caught)
        model.reset()
    return out


def run_steps(nets: Sequence[str], batches: Sequence[int], precisions: Sequence[str], iterations: int,
              warm_up: int, seconds: float, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every net x batch x precision, trainer then bare, within `seconds` in all: each net gets an equal share of
    the time left when it starts, and each side the time left to its net's end over the sides still to run (what a
    fast side leaves goes to the slower ones after it, the largest batches last).  The rows and the device."""
    deadline = time.perf_counter() + seconds
    rows: list[SideTiming] = []
    built: dict[str, Any] = {}
    syncs: dict[str, Any] = {}
    for k, name in enumerate(nets):
        net_end = time.perf_counter() + (deadline - time.perf_counter()) / (len(nets) - k)
        if deadline - time.perf_counter() < 5:
            rows += [SideTiming(name, b, p, s, "skipped: the deadline came before the net was built")
                     for b in batches for p in precisions for s in ("trainer", "bare")]
            continue
        t0 = time.perf_counter()
        model = build_model(name)
        built[name] = {"seconds": time.perf_counter() - t0, "input": list(model.spec.input_shape),
                       "classes": model.spec.num_classes, "blobs": len(model.net.infos),
                       "parameters": int(sum(p.numel() for p in model.net.params)),
                       "solver_history_bytes": model.history_bytes,
                       "initial_bytes": sum(t.numel() * t.element_size() for t in model.initial)}
        say(f"{name}: built in {built[name]['seconds']:.1f} s, {built[name]['parameters'] / 1e6:.1f} M parameters")
        if not syncs:
            syncs = {"net": name, "batch": min(batches), "precision": precisions[0],
                     "per_iteration": count_syncs(model, precisions[0], min(batches))}
        sides_left = 2 * len(batches) * len(precisions)
        for batch in batches:
            on_device = device_batches(model, batch, seed=batch)
            for precision in precisions:
                for side in ("trainer", "bare"):
                    left = (net_end - time.perf_counter()) / sides_left
                    sides_left -= 1
                    row = time_side(model, side, precision, on_device, iterations, warm_up, left)
                    rows.append(row)
                    say(f"{name} batch {batch} {precision} {side}: {row.status}, {row.images_per_s:.0f} images/s, "
                        f"peak {row.peak_bytes / 2**30:.2f} GiB")
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"format": GPU_STEPS_FORMAT, "device": device_info(), "cudnn": cudnn_settings(),
            "solver": {"type": "SGD", "base_lr": BASE_LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY},
            "iterations": iterations, "warm_up": warm_up, "seconds": seconds,
            "nets": built, "syncs": syncs, "rows": [asdict(r) for r in rows]}


def cudnn_settings() -> dict[str, Any]:
    return {"deterministic": torch.backends.cudnn.deterministic, "benchmark": torch.backends.cudnn.benchmark}


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    """`python -m firescale.bench.gpu_steps`'s arguments (no abbreviation taken, as no firescale parser takes one)."""
    parser = argparse.ArgumentParser(prog="python -m firescale.bench.gpu_steps", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--json", type=Path, required=True, help="write the device and the rows here")
    parser.add_argument("--info", action="store_true", help="only the device and the versions")
    parser.add_argument("--nets", default=",".join(NETS), help=f"default {','.join(NETS)}")
    parser.add_argument("--batches", default="64,128,256")
    parser.add_argument("--precisions", default="fp32,tf32,bf16")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations a side (default 10)")
    parser.add_argument("--warm-up", type=int, default=2, help="iterations before timing (default 2)")
    parser.add_argument("--seconds", type=float, default=180.0, help="the whole run's budget (default 180)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.info:
        result: dict[str, Any] = {"format": GPU_STEPS_FORMAT, "device": device_info()}
    else:
        result = run_steps(_names(args.nets), [int(b) for b in _names(args.batches)], _names(args.precisions),
                           args.iterations, args.warm_up, args.seconds, say=lambda s: print(s, flush=True))
    args.json.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
