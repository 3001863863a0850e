"""What TensorFlow really allocates for one training iteration of a net, per layer and pass."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

# The model (model/memory.py) describes oneDNN's CPU kernels: a max pool's argmax workspace, convolution
# gradients without an im2col copy.  TensorFlow 2.15 turns them on by default only on CPUs with AVX-512; on
# others (an AMD EPYC with AVX2 here) Eigen's kernels run, whose filter gradients take 17 MB of scratch
# for LeNet's 2 KB.  Asked for before TensorFlow loads, oneDNN's run on any x86 CPU.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import tensorflow as tf  # noqa: E402

from firescale.bench.memory import MeasuredLayer, MeasuredMemory
from firescale.caffe.solver import SolverConfig
from firescale.nets.spec import NetSpec, infer_shapes
from firescale.train.tensorflow.nets import build_net
from firescale.train.tensorflow.solvers import CaffeSolver
from firescale.train.tensorflow.steps import apply_update, loss_and_gradients


def _owner(path: str, names: list[str]) -> str | None:
    """The layer whose name scope holds op `path` (the longest layer name that is a scope prefix)."""
    best = None
    for name in names:
        if (path == name or path.startswith(name + "/")) and (best is None or len(name) > len(best)):
            best = name
    return best


def _split_node_name(node: str) -> tuple[str, str]:
    """(pass, scope path inside the step) of a node of an inlined traced step."""
    parts = node.split("/")
    while parts and (parts[0].startswith(("StatefulPartitionedCall", "PartitionedCall")) or parts[0] == "Func"):
        parts = parts[1:]
    path = "/".join(parts)
    for prefix in ("gradient_tape/", "gradients/"):  # a tape's gradients, or tf.gradients' (a split net)
        if path.startswith(prefix):
            return "backward", path[len(prefix):]
    if path.startswith("update/"):
        return "update", path[len("update/"):]
    return "forward", path


def _attribute(run_metadata: Any, names: list[str], layers: dict[str, MeasuredLayer],
               other: dict[str, int], forced_pass: str | None = None) -> int:
    """Add each node's allocations to its layer and pass; returns the run's peak of live tensor bytes.

    The peak comes from the allocation records of this run's kernels (each allocation and its release,
    timed), not from the allocator's bytes in use, which other threads of the process move too.
    """
    events: list[tuple[int, int]] = []
    for node in (n for d in run_metadata.step_stats.dev_stats for n in d.node_stats):
        events += [(r.alloc_micros, -r.alloc_bytes) for m in node.memory for r in m.allocation_records]
        allocated = sum(m.total_bytes for m in node.memory)
        if not allocated:
            continue
        phase, path = _split_node_name(node.node_name)
        phase = forced_pass or phase
        owner = _owner(path, names)
        if owner is None:
            key = f"{phase}:{path.split('/')[0]}"
            other[key] = other.get(key, 0) + allocated
        else:
            setattr(layers[owner], phase, getattr(layers[owner], phase) + allocated)
    live = peak = 0
    for _, negated in sorted(events):  # in a tie, allocations (negated: below zero) count first
        live -= negated
        peak = max(peak, live)
    return peak


def _traced_run(session: Any, fetches: Any, feed: dict[Any, Any]) -> tuple[Any, Any]:
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    values = session.run(fetches, feed, options=options, run_metadata=metadata)
    return values, metadata


def measure_training_memory(spec: NetSpec, batch: int, solver: SolverConfig, *, seed: int = 1,
                            ranks: int = 1) -> MeasuredMemory:
    """Run one training iteration of `spec` at `batch` as the trainer runs it and record the allocations.

    The trainer's own code builds the net, the solver and both steps; they run in a TensorFlow session
    with a full trace, so every kernel's allocations are read from TensorFlow's allocator (after its
    graph optimisations, buffer reuse and fusions).  As in the trainer, the forward/backward step and
    the update are separate runs and the update reads gradients it may not overwrite.
    """
    names = [rec.name for rec in infer_shapes(spec)]
    layers = {n: MeasuredLayer(n) for n in names}
    other: dict[str, int] = {}
    graph = tf.Graph()
    with graph.as_default():
        net = build_net(spec, seed)
        caffe = CaffeSolver(solver, net.params, [i.name for i in net.infos])
        images = tf.compat.v1.placeholder(tf.float32, (batch, *spec.input_shape))
        labels = tf.compat.v1.placeholder(tf.int64, (batch,))
        dropout_seed = tf.compat.v1.placeholder(tf.int64, (2,))
        step = tf.function(lambda x, y, s: loss_and_gradients(net, x, y, s), autograph=False)
        loss, grads = step(images, labels, dropout_seed)
        fed = [tf.compat.v1.placeholder(tf.float32, p.shape) for p in net.params]
        before = set(graph.get_operations())
        tf.function(lambda g: apply_update(caffe, g, tf.constant(1e-3), tf.constant(0, tf.int64), batch * ranks))(fed)
        update = [op for op in graph.get_operations() if op not in before and op.type == "StatefulPartitionedCall"]
        one_thread = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
        session = tf.compat.v1.Session(graph=graph, config=one_thread)  # as each rank runs
        session.run([v.initializer for v in net.params + caffe.history + caffe.update_history])
    rng = np.random.default_rng(seed)
    feed = {images: rng.random((batch, *spec.input_shape), dtype=np.float32),
            labels: rng.integers(0, spec.num_classes, batch), dropout_seed: np.array([seed, 0])}
    session.run([loss, grads], feed)  # the first run sets up kernels; the traced one is the second
    (_, values), grad_meta = _traced_run(session, [loss, grads], feed)
    update_feed = {p: v for p, v in zip(fed, values)}
    session.run(update, update_feed)
    _, update_meta = _traced_run(session, update, update_feed)
    grad_peak = _attribute(grad_meta, names, layers, other)
    update_peak = _attribute(update_meta, names, layers, other, forced_pass="update")
    for info, var in zip(net.infos, net.params):
        layers[info.layer].weights += int(np.prod(var.shape)) * 4
    for var, info in zip(caffe.history + caffe.update_history, net.infos + net.infos):
        layers[info.layer].history += int(np.prod(var.shape)) * 4
    session.close()
    inputs = sum(np.asarray(feed[key]).nbytes for key in (images, labels))
    return MeasuredMemory(spec.name, batch, solver.type, [layers[n] for n in names], other, grad_peak, update_peak,
                          inputs)
