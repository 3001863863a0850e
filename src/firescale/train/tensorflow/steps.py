"""The traced training steps: one whole iteration, its parts (gradients, update) apart, evaluation, warm-up.

The whole iteration is traced by `trace_iteration` from what it needs (which blobs are learnt, a loss and
gradients, a sum over the ranks, a solver), so that `bench allreduce`'s probe (bench/allreduce_tensorflow.py)
times this same function around a stand-in for the net's compute instead of a copy of it.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import tensorflow as tf

from firescale.train.tensorflow.evaluation import make_eval_step
from firescale.train.tensorflow.nets import CaffeNet
from firescale.train.tensorflow.solvers import CaffeSolver


@dataclass(frozen=True)
class TrainSteps:
    """The traced functions one rank runs: `iteration` (a whole iteration of one micro-batch in one graph:
    gradients, their sum over the ranks with the loss and stop flag, the update; returns the summed loss
    and flag), its parts `grad` (loss sum and gradients of a micro-batch) and `apply` (the solver's update
    from summed gradients), all concrete functions, and `evaluate` (test-set sums of a batch)."""

    iteration: Callable[..., Any]
    grad: Callable[..., Any]
    apply: Callable[..., Any]
    evaluate: Callable[..., Any]


class LearntBlobs(Protocol):
    """What the iteration's sum reads of a net: per blob, in the order its gradients come, whether it is
    learnt (BatchNorm's statistics are not, and are not sent)."""

    @property
    def learnt(self) -> Sequence[bool]: ...


class Compute(Protocol):
    """A micro-batch's summed loss and its gradients, one per blob of the net (`loss_and_gradients` of a net,
    or the probe's stand-in for it); traceable."""

    def __call__(self, images: tf.Tensor, labels: tf.Tensor,
                 dropout_seed: tf.Tensor) -> tuple[tf.Tensor, Sequence[tf.Tensor]]: ...


# Element-wise sums over the ranks of each tensor, inside the graph: Rank.sum (one grouped allreduce) or
# Rank.sum_each (one request a tensor).
SumOverRanks = Callable[[list[tf.Tensor]], list[tf.Tensor]]


def loss_and_gradients(net: CaffeNet, images: tf.Tensor, labels: tf.Tensor,
                       dropout_seed: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """The summed softmax cross-entropy of a batch and its gradients with respect to every parameter.

    A net split over devices takes its gradients with each one's ops colocated with the forward op it
    differentiates, so that a layer's backward pass runs on the layer's device (a tape would put them
    all on the default device).  BatchNorm's statistics, which Caffe keeps among the learnable blobs with
    lr_mult 0 and never differentiates, get a zero gradient, as Caffe's cleared diff.
    """
    def loss_of(logits: tf.Tensor) -> tf.Tensor:
        with tf.device(net.loss_device), tf.name_scope("loss"):
            return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    if net.devices:
        loss_sum = loss_of(net(images, training=True, dropout_seed=dropout_seed))
        grads = tf.compat.v1.gradients(loss_sum, net.params, colocate_gradients_with_ops=True,
                                       unconnected_gradients="zero")
    else:
        with tf.GradientTape() as tape:
            loss_sum = loss_of(net(images, training=True, dropout_seed=dropout_seed))
        grads = tape.gradient(loss_sum, net.params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    # Stored statistics (use_global_stats: true) do reach the loss, but Caffe never computes their diff: zero, so
    # that an adaptive solver's history of them stays zero and no rank sends them.
    return loss_sum, [g if keep else tf.zeros_like(p) for g, p, keep in zip(grads, net.params, net.learnt)]


def sum_learnt(net: LearntBlobs, sum_over_ranks: SumOverRanks, grads: list[tf.Tensor],
               extra: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor]:
    """The gradients summed over the ranks, and `extra` (the loss and stop flag) summed with them.  The
    gradients of BatchNorm's statistics, zero on every rank, are not sent: they stay the zeros they are
    (Caffe sends them, as they are among its learnable blobs; the sum is the same, and the message is
    the model's |W|)."""
    learnt = net.learnt
    sent = sum_over_ranks([g for g, keep in zip(grads, learnt) if keep] + [extra])
    summed = iter(sent[:-1])
    return [next(summed) if keep else g for g, keep in zip(grads, learnt)], sent[-1]


def apply_update(solver: CaffeSolver, summed: list[tf.Tensor], rate: tf.Tensor, iteration: tf.Tensor,
                 effective_batch: Any) -> None:
    """The solver's update from gradients summed over the effective batch (normalised here, as Caffe)."""
    with tf.name_scope("update"):
        scale = tf.cast(effective_batch, tf.float32)
        normalised = []
        for g, name in zip(summed, solver.names):
            with tf.name_scope(name):
                normalised.append(g / scale)
        solver.apply(normalised, rate, iteration)


def trace_iteration(net: LearntBlobs, solver: CaffeSolver, image_shape: tuple[int, ...], compute: Compute,
                    sum_over_ranks: SumOverRanks) -> Callable[..., Any]:
    """The whole iteration of one micro-batch of images of `image_shape` (H, W, C) as one concrete function:
    `compute`'s gradients, their sum over the ranks with the loss and stop flag (`sum_learnt`), the solver's
    update (`apply_update`); it returns the summed loss and flag.  Its arguments are the images, labels,
    dropout seed (2 int64), rate, 0-based iteration (int64), effective batch and stop flag (float32).

    The trainer traces it around the net's `loss_and_gradients` and its rank's `Rank.sum` (or `sum_each`);
    `bench allreduce` around a stand-in compute of a chosen length, so that what it times between a step and
    the next is this function's graph (bench/allreduce_tensorflow.py)."""
    x_spec = tf.TensorSpec((None, *image_shape), tf.float32)
    scalar = tf.TensorSpec((), tf.float32)

    @tf.function(input_signature=[x_spec, tf.TensorSpec((None,), tf.int64), tf.TensorSpec((2,), tf.int64), scalar,
                                  tf.TensorSpec((), tf.int64), scalar, scalar], autograph=False)
    def iteration_step(images: tf.Tensor, labels: tf.Tensor, dropout_seed: tf.Tensor, rate: tf.Tensor,
                       iteration: tf.Tensor, batch: tf.Tensor, stop_flag: tf.Tensor) -> tf.Tensor:
        loss_sum, grads = compute(images, labels, dropout_seed)
        summed, loss_and_flag = sum_learnt(net, sum_over_ranks, list(grads), tf.stack([loss_sum, stop_flag]))
        apply_update(solver, summed, rate, iteration, batch)
        return loss_and_flag

    return iteration_step.get_concrete_function()


def make_train_steps(net: CaffeNet, solver: CaffeSolver, image_shape: tuple[int, ...],
                     sum_over_ranks: SumOverRanks, *, sum_each: SumOverRanks | None = None) -> TrainSteps:
    """Trace the iteration, grad, apply and evaluation steps of `net` for images of `image_shape` (H, W, C);
    the update takes the images it averages over (the effective batch) as an argument, since it may
    change, and the learning rate as a tensor, so that neither retraces.  `sum_over_ranks` is the
    grouped allreduce (Rank.sum), which the iteration step runs inside its graph after the whole backward
    pass.  With `sum_each` (Rank.sum_each) the iteration step overlaps instead: one allreduce per gradient,
    none waiting for another, so that the graph hands each to Horovod as soon as backward has produced its
    gradient (wait-free backprop), and each layer's update runs as soon as its sum is back."""
    x_spec = tf.TensorSpec((None, *image_shape), tf.float32)
    y_spec = tf.TensorSpec((None,), tf.int64)
    scalar = tf.TensorSpec((), tf.float32)
    # Traced without AutoGraph: the steps' Python branches and loops follow the net and the solver, never a
    # tensor's value, so rewriting the source of every function they call (2.1 of a rank's 4.9 s start for
    # LeNet here) changes nothing in the graph.  A branch on a tensor fails at tracing, never silently.

    @tf.function(input_signature=[x_spec, y_spec, tf.TensorSpec((2,), tf.int64)], autograph=False)
    def grad_step(images: tf.Tensor, labels: tf.Tensor, dropout_seed: tf.Tensor) -> Any:
        return loss_and_gradients(net, images, labels, dropout_seed)

    grad_specs = [tf.TensorSpec(p.shape, tf.float32) for p in net.params]

    @tf.function(input_signature=[grad_specs, scalar, tf.TensorSpec((), tf.int64), scalar], autograph=False)
    def apply_step(summed: list[tf.Tensor], rate: tf.Tensor, iteration: tf.Tensor, batch: tf.Tensor) -> None:
        apply_update(solver, summed, rate, iteration, batch)

    # Called every iteration: the concrete functions skip tf.function's per-call matching of arguments to
    # traces (its cost: docs/performance-model.md, `bench trainer`).
    iteration = trace_iteration(net, solver, image_shape, functools.partial(loss_and_gradients, net),
                                sum_each or sum_over_ranks)
    return TrainSteps(iteration, grad_step.get_concrete_function(), apply_step.get_concrete_function(),
                      make_eval_step(net, net.spec.num_classes, image_shape))


def warm_up(steps: TrainSteps, batch: int, image_shape: tuple[int, ...], seed: int,
            state: list[tf.Variable]) -> None:
    """Run every graph once on zeros before any clock starts; the iteration and the update change `state`
    (the weights and the solver's history), which is put back as it was afterwards.

    TensorFlow optimises a graph and sets up its kernels on its first execution, not when tracing it,
    and Horovod negotiates an allreduce on its first call; without this the first iterations timed
    would carry it.  Every rank runs the iteration's allreduce here together.
    """
    zeros = tf.zeros((batch, *image_shape), tf.float32)
    no_labels = tf.zeros((batch,), tf.int64)
    dropout_seed = tf.constant([seed, 0], tf.int64)
    rate, iteration, images = tf.constant(0.0), tf.constant(0, tf.int64), tf.constant(float(batch))
    saved = [tf.identity(v) for v in state]   # a read is a copy: the updates below do not reach it
    loss, grads = steps.grad(zeros, no_labels, dropout_seed)
    tf.stack([loss, rate]).numpy()     # the eager op that joins the loss and the stop flag, once
    steps.apply(grads, rate, iteration, images)
    steps.iteration(zeros, no_labels, dropout_seed, rate, iteration, images, tf.constant(0.0)).numpy()
    for variable, value in zip(state, saved):
        variable.assign(value)
    steps.evaluate(zeros, no_labels).numpy()
