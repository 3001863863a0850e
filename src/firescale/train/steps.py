"""The traced training steps: forward/backward of one micro-batch, the solver's update, evaluation, warm-up."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import tensorflow as tf

from .evaluation import make_eval_step
from .nets import CaffeNet
from .solvers import CaffeSolver


@dataclass(frozen=True)
class TrainSteps:
    """The three traced functions one rank runs: `grad` (loss sum and gradients of a micro-batch),
    `apply` (the solver's update from summed gradients), both concrete functions, and `evaluate`
    (test-set sums of a batch)."""

    grad: Callable[..., Any]
    apply: Callable[..., Any]
    evaluate: Callable[..., Any]


def loss_and_gradients(net: CaffeNet, images: tf.Tensor, labels: tf.Tensor,
                       dropout_seed: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """The summed softmax cross-entropy of a batch and its gradients with respect to every parameter.

    A net split over devices takes its gradients with each one's ops colocated with the forward op it
    differentiates, so that a layer's backward pass runs on the layer's device (a tape would put them
    all on the default device).
    """
    def loss_of(logits: tf.Tensor) -> tf.Tensor:
        with tf.device(net.loss_device), tf.name_scope("loss"):
            return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    if net.devices:
        loss_sum = loss_of(net(images, training=True, dropout_seed=dropout_seed))
        return loss_sum, tf.compat.v1.gradients(loss_sum, net.params, colocate_gradients_with_ops=True)
    with tf.GradientTape() as tape:
        loss_sum = loss_of(net(images, training=True, dropout_seed=dropout_seed))
    return loss_sum, tape.gradient(loss_sum, net.params)


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


def make_train_steps(net: CaffeNet, solver: CaffeSolver, image_shape: tuple[int, ...]) -> TrainSteps:
    """Trace the grad, apply and evaluation steps of `net` for images of `image_shape` (H, W, C); the
    update takes the images it averages over (the effective batch) as an argument, since it may change."""
    x_spec = tf.TensorSpec((None, *image_shape), tf.float32)
    y_spec = tf.TensorSpec((None,), tf.int64)

    @tf.function(input_signature=[x_spec, y_spec, tf.TensorSpec((2,), tf.int64)])
    def grad_step(images: tf.Tensor, labels: tf.Tensor, dropout_seed: tf.Tensor) -> Any:
        return loss_and_gradients(net, images, labels, dropout_seed)

    grad_specs = [tf.TensorSpec(p.shape, tf.float32) for p in net.params]

    @tf.function(input_signature=[grad_specs, tf.TensorSpec((), tf.float32), tf.TensorSpec((), tf.int64),
                                  tf.TensorSpec((), tf.float32)])
    def apply_step(summed: list[tf.Tensor], rate: tf.Tensor, iteration: tf.Tensor, batch: tf.Tensor) -> None:
        apply_update(solver, summed, rate, iteration, batch)

    # Called every iteration: the concrete functions skip tf.function's per-call matching of arguments to
    # traces (about 0.4 ms an iteration for LeNet on a CPU core, measured by `bench trainer`).
    return TrainSteps(grad_step.get_concrete_function(), apply_step.get_concrete_function(),
                      make_eval_step(net, net.spec.num_classes, image_shape))


def warm_up(steps: TrainSteps, batch: int, image_shape: tuple[int, ...], seed: int) -> None:
    """Run the grad and evaluation graphs once on zeros, before any clock starts (the update is traced already).

    TensorFlow optimises a graph and sets up its kernels on its first execution, not when tracing it.
    Neither graph touches the weights, the solver's history or the data stream; the update would, so
    it is traced only.
    """
    zeros = tf.zeros((batch, *image_shape), tf.float32)
    no_labels = tf.zeros((batch,), tf.int64)
    steps.grad(zeros, no_labels, tf.constant([seed, 0], tf.int64))[0].numpy()
    steps.evaluate(zeros, no_labels).numpy()
