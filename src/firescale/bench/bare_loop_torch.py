"""A minimal bare PyTorch loop: the yardstick `bench trainer --framework pytorch` measures the trainer by.

What a user would write: the batches already in memory as NCHW tensors on the rank's device, and per
iteration the forward pass, the summed softmax cross-entropy, its gradients by torch.autograd.grad, one
all_reduce(SUM) of them and the loss flattened into one buffer (torch.distributed's, or on the MPI group
mpi4py's MPI_Allreduce in place on the buffer's memory), the mean over the global batch and the solver's
update, with no wait for the device on the host.  It shares with the trainer only what must be the same for
a fair comparison: the rank set-up (init_rank: one core per rank, one thread, the MPI, Gloo or NCCL process
group), the net (CaffeNet) and Caffe's update rule (CaffeSolver); run it as ranks of a launcher:

    mpirun -np 2 python -m firescale.bench.bare_loop_torch --dataset D --net lenet_same --solver S \
        --batch-per-rank 64 --iterations 400 --json out.json
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from firescale.atomic import atomic_write_json
from firescale.bench.bare_loop import BARE_FORMAT, BATCHES_IN_MEMORY


def _in_memory_batches(dataset: Path, rank: int, size: int, batch: int, seed: int,
                       device: torch.device) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple]:
    """This rank's first BATCHES_IN_MEMORY training batches in the trainer's order (firescale's sharding of
    the seeded shuffle), transformed as the trainer's, as NCHW tensors on `device`."""
    from firescale.data.readers import Transform, iter_train_arrays, open_dataset
    from firescale.data.transforms import BatchTransformer

    ds = open_dataset(dataset, "train")
    transform = Transform(scale=1 / 255)
    shape = tuple(BatchTransformer(transform, ds.shape).out_shape)
    stream = iter_train_arrays(ds, transform, seed=seed, rank=rank, size=size, batch_per_rank=batch)
    batches = []
    for _ in range(BATCHES_IN_MEMORY):
        images, labels = next(stream)
        x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)   # NHWC read, NCHW kept
        batches.append((x, torch.from_numpy(labels).to(device=device, dtype=torch.int64)))
    return batches, (shape, ds.num_classes)


class BareStep:
    """One iteration as a user writes it (see the module's note); the summed loss stays on the device."""

    def __init__(self, net: Any, solver: Any, size: int, effective_batch: int, seed: int, rank: int,
                 comm: Any = None) -> None:
        self.net, self.solver, self.size = net, solver, size
        self.comm = comm       # the MPI group's communicator (None: torch.distributed's group)
        self.scale = 1.0 / float(effective_batch)    # the trainer's: each gradient times 1 / batch
        self.learnt = [p for p, keep in zip(net.params, net.learnt) if keep]
        self.fixed = {i: torch.zeros_like(p) for i, (p, keep) in enumerate(zip(net.params, net.learnt)) if not keep}
        self.numels = [p.numel() for p in self.learnt]
        self.seed, self.rank = seed, rank
        self.generator = torch.Generator(device=self.learnt[0].device)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, rate: float, iteration: int) -> torch.Tensor:
        # Dropout's masks from the run's seed and the micro-batch's global index, as the trainer draws them.
        self.generator.manual_seed((self.seed & 0xFFFFFFFF) << 32 | ((iteration * self.size + self.rank) & 0xFFFFFFFF))
        logits = self.net(images, training=True, dropout_generator=self.generator)
        loss = F.cross_entropy(logits, labels, reduction="sum")
        grads = torch.autograd.grad(loss, self.learnt)
        if self.size > 1:     # one buffer, one all_reduce
            flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
            if self.comm is not None:
                from mpi4py import MPI

                self.comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
            else:
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            loss = flat[-1]
            grads = tuple(p.view_as(g) for p, g in zip(flat[:-1].split(self.numels), grads))
        learnt = iter(torch._foreach_mul(grads, self.scale))
        self.solver.apply([self.fixed[i] if i in self.fixed else next(learnt) for i in range(len(self.net.params))],
                          rate, iteration)
        return loss.detach()


def _solver(cfg: Any, net: Any, solver_path: Path) -> Any:
    from firescale.train.net_file import blob_multipliers
    from firescale.train.torch.solvers import CaffeSolver

    lr, decay = blob_multipliers(net.spec, net.infos, None, cfg, solver_path)
    return CaffeSolver(cfg, net, lr, decay)


def _warm_up(step: BareStep, batch: tuple[torch.Tensor, torch.Tensor], state: list[torch.Tensor]) -> None:
    """One iteration before the clock starts, the weights and the solver's history put back afterwards: the
    allocator, the kernels' first choices and the process group's first all_reduce are not timed (the
    trainer's warm_up does the same)."""
    saved = [t.detach().clone() for t in state]
    step(*batch, 0.0, 0).item()
    with torch.no_grad():
        for tensor, value in zip(state, saved):
            tensor.copy_(value)


def run_bare_loop(dataset: Path, net_name: str, solver_path: Path, batch_per_rank: int,
                  iterations: int, process_group: str = "auto") -> dict[str, Any]:
    """Train `iterations` iterations on every rank after one warm-up iteration undone; images/s from the
    slowest rank, and the last iteration's loss."""
    from firescale.caffe.lr_policies import learning_rate
    from firescale.caffe.solver import load_solver
    from firescale.nets.zoo import get_net
    from firescale.train.torch.distributed import init_rank
    from firescale.train.torch.nets import CaffeNet

    rank = init_rank(1, process_group=process_group)
    device = torch.device(rank.device)
    cfg = load_solver(solver_path, [])
    seed = cfg.random_seed if cfg.random_seed >= 0 else 1
    torch.manual_seed(seed)
    batches, (shape, classes) = _in_memory_batches(dataset, rank.rank, rank.size, batch_per_rank, seed, device)
    net = CaffeNet(get_net(net_name, num_classes=classes, input_shape=shape), seed, device=device)
    solver = _solver(cfg, net, solver_path)
    state = [*net.params, *solver.history, *solver.update_history]
    rank.broadcast_tensors(state)
    step = BareStep(net, solver, rank.size, batch_per_rank * rank.size, seed, rank.rank, rank.comm)
    rates = [learning_rate(cfg, i) for i in range(iterations)]
    _warm_up(step, batches[0], state)
    rank.barrier()
    start = time.perf_counter()
    for i in range(iterations):
        loss = step(*batches[i % len(batches)], rates[i], i)
    last_loss = loss.item() / (batch_per_rank * rank.size)
    slowest = _max_over_ranks(rank, time.perf_counter() - start)
    rank.close()
    return {"format": BARE_FORMAT, "framework": "pytorch", "ranks": rank.size, "batch_per_rank": batch_per_rank,
            "iterations": iterations, "seconds": slowest,
            "images_per_s": iterations * batch_per_rank * rank.size / slowest, "final_loss": last_loss,
            "net": net_name, "rank": rank.rank, "device": rank.device, "process_group": rank.process_group}


def _max_over_ranks(rank: Any, value: float) -> float:
    if rank.size == 1:
        return value
    if rank.comm is not None:
        from mpi4py import MPI

        return float(rank.comm.allreduce(value, op=MPI.MAX))
    t = torch.tensor([value], dtype=torch.float64, device=rank.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def build_parser() -> argparse.ArgumentParser:
    """`python -m firescale.bench.bare_loop_torch`'s arguments (no abbreviation taken, as no firescale parser
    takes one)."""
    parser = argparse.ArgumentParser(prog="python -m firescale.bench.bare_loop_torch",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--net", default="lenet_same")
    parser.add_argument("--solver", type=Path, required=True)
    parser.add_argument("--batch-per-rank", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--json", type=Path, required=True, help="where rank 0 writes the result")
    parser.add_argument("--process-group", default="auto", help="as firescale train's (default auto)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_bare_loop(args.dataset, args.net, args.solver, args.batch_per_rank, args.iterations,
                           args.process_group)
    if result.pop("rank") == 0:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
