"""A minimal bare Horovod TensorFlow loop: the yardstick `bench trainer` holds `firescale train` against.

What a user would write: the batches already in memory as tensors, one tf.function per step that
takes the gradients, sums them (and the loss) with one grouped Horovod allreduce and applies the
solver, no per-step host copy.  It shares with the trainer only what must be the same for a fair
comparison: the rank set-up (init_rank: one core per rank, one thread, deterministic ops), the net
(build_net) and Caffe's update rule (CaffeSolver); run it as ranks of a launcher:

    mpirun -np 2 python -m firescale.bench.bare_loop --dataset D --net lenet_same --solver S --batch-per-rank 64 \
        --iterations 400 --json out.json
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from firescale.atomic import atomic_write_json

BARE_FORMAT = "firescale.bench.bare_loop/1"
BATCHES_IN_MEMORY = 16     # distinct batches cycled through (the data are in memory, never read during timing)


def _in_memory_batches(dataset: Path, rank: int, size: int, batch: int, seed: int) -> tuple[list[Any], tuple]:
    """This rank's first BATCHES_IN_MEMORY training batches, transformed as the trainer's, as tensors."""
    import tensorflow as tf

    from firescale.data.readers import Transform, iter_train_arrays, open_dataset
    from firescale.data.transforms import BatchTransformer

    ds = open_dataset(dataset, "train")
    transform = Transform(scale=1 / 255)
    shape = tuple(BatchTransformer(transform, ds.shape).out_shape)
    stream = iter_train_arrays(ds, transform, seed=seed, rank=rank, size=size, batch_per_rank=batch)
    batches = []
    for _ in range(BATCHES_IN_MEMORY):
        images, labels = next(stream)
        batches.append((tf.constant(images), tf.constant(labels)))
    return batches, (shape, ds.num_classes)


def _solver(cfg: Any, net: Any) -> Any:
    from firescale.train.tensorflow.solvers import CaffeSolver

    infos = net.infos
    lr = [cfg.lr_mult.get(i.layer, [1.0, 1.0])[0 if i.blob == "weights" else 1] for i in infos]
    decay = [cfg.decay_mult.get(i.layer, [1.0, 1.0])[0 if i.blob == "weights" else 1] for i in infos]
    return CaffeSolver(cfg, net.params, [i.name for i in infos], lr, decay)


def make_step(net: Any, solver: Any, hvd: Any, size: int, effective_batch: int) -> Any:
    """One traced iteration: gradients, one grouped allreduce of them and the loss, the solver's update."""
    import tensorflow as tf

    @tf.function
    def step(images: tf.Tensor, labels: tf.Tensor, rate: tf.Tensor, iteration: tf.Tensor, seed: tf.Tensor) -> Any:
        with tf.GradientTape() as tape:
            logits = net(images, training=True, dropout_seed=seed)
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, net.params) + [loss]
        summed = hvd.grouped_allreduce(grads, op=hvd.Sum) if size > 1 else grads
        solver.apply([g / float(effective_batch) for g in summed[:-1]], rate, iteration)
        return summed[-1]

    return step


def run_bare_loop(dataset: Path, net_name: str, solver_path: Path, batch_per_rank: int,
                  iterations: int) -> dict[str, Any]:
    """Train `iterations` iterations on every rank, the step traced (not run) before the clock starts, as
    the trainer's update is; images/s from the slowest rank, and the last iteration's loss."""
    import tensorflow as tf

    from firescale.caffe.lr_policies import learning_rate
    from firescale.caffe.solver import load_solver
    from firescale.nets.zoo import get_net
    from firescale.train.tensorflow.distributed import init_rank
    from firescale.train.tensorflow.nets import build_net

    rank = init_rank(1)
    cfg = load_solver(solver_path, [])
    seed = cfg.random_seed if cfg.random_seed >= 0 else 1
    tf.random.set_seed(seed)
    batches, (shape, classes) = _in_memory_batches(dataset, rank.rank, rank.size, batch_per_rank, seed)
    net = build_net(get_net(net_name, num_classes=classes, input_shape=shape), seed)
    solver = _solver(cfg, net)
    rank.broadcast_variables(net.params + solver.history + solver.update_history)
    step = make_step(net, solver, rank.hvd, rank.size, batch_per_rank * rank.size)
    rates = [tf.constant(learning_rate(cfg, i), tf.float32) for i in range(iterations)]
    seeds = [tf.constant([seed, i], tf.int64) for i in range(iterations)]
    step.get_concrete_function(*batches[0], rates[0], tf.constant(0, tf.int64), seeds[0])
    rank.barrier()
    start = time.perf_counter()
    for i in range(iterations):
        images, labels = batches[i % len(batches)]
        loss = step(images, labels, rates[i], tf.constant(i, tf.int64), seeds[i])
    last_loss = float(loss.numpy()) / (batch_per_rank * rank.size)
    slowest = _max_over_ranks(rank, time.perf_counter() - start)
    return {"format": BARE_FORMAT, "ranks": rank.size, "batch_per_rank": batch_per_rank, "iterations": iterations,
            "seconds": slowest, "images_per_s": iterations * batch_per_rank * rank.size / slowest,
            "final_loss": last_loss, "net": net_name}


def _max_over_ranks(rank: Any, value: float) -> float:
    import tensorflow as tf

    if rank.size == 1:
        return value
    return float(rank.hvd.allreduce(tf.constant(value, tf.float64), op=rank.hvd.Max).numpy())


def build_parser() -> argparse.ArgumentParser:
    """`python -m firescale.bench.bare_loop`'s arguments (no abbreviation taken, as no firescale parser takes one)."""
    parser = argparse.ArgumentParser(prog="python -m firescale.bench.bare_loop", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--net", default="lenet_same")
    parser.add_argument("--solver", type=Path, required=True)
    parser.add_argument("--batch-per-rank", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--json", type=Path, required=True, help="where rank 0 writes the result")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_bare_loop(args.dataset, args.net, args.solver, args.batch_per_rank, args.iterations)
    import horovod.tensorflow as hvd

    if hvd.rank() == 0:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
