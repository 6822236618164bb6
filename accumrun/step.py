"""The accumulation step: one compiled call per batch, one optimizer update per batch.

The rule: a batch of ``n`` samples is cut into ``s = min(subdivisions, n)`` sub-batches (see
:mod:`accumrun.split`). Each sub-batch runs forward and backward on the *sum* of its per-sample losses divided
by ``n``, the whole batch's sample count. Summing those gradients over the sub-batches therefore gives exactly
the gradient of the batch's mean loss, however unevenly the batch splits: it is the sample-weighted mean of the
sub-batch mean gradients. Recipes that average the ``s`` sub-batch means (divide by ``s``) are wrong whenever
the sub-batches differ in size.

All sub-batches run inside one ``tf.function`` (autograph ``tf.while_loop`` loops: one, or one per sub-batch
size when the batch's shape is static), slicing the batch where it already lives, on the device. Only one
sub-batch's activations are alive at a time; the extra memory is one accumulator per trainable variable.
This module knows nothing of configs, files or the command line.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import keras
import tensorflow as tf

from accumrun.split import sub_batch_sizes

# How many sub-batches the loop may run at once (TensorFlow's default is 10). More is faster on tiny sub-batches
# but holds that many sub-batches' activations; benchmarks/step_speed.py --parallel measures it.
PARALLEL_SUB_BATCHES = 1

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
"""``loss_fn(labels, logits) -> per-sample losses`` (shape ``[n]``)."""


def sparse_categorical_crossentropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-sample cross-entropy of integer labels against logits, computed in float32."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))


def _correct_count(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    predicted = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    return tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.int32))


def make_gradient_fn(
    model: keras.Model,
    loss_fn: LossFn,
    subdivisions: int,
    jit_compile: bool = False,
    scale_loss: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> Callable[..., tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]]:
    """A function ``(x, y, total=None) -> (gradients, loss_sum, correct)`` that accumulates over the sub-batches.

    ``gradients`` is the gradient of the batch's mean loss (plus the model's regularization losses) with
    respect to ``model.trainable_variables``; ``loss_sum`` is the sum of the per-sample losses and ``correct``
    the number of samples whose largest logit is their label. ``total`` is the sample count that the losses are
    divided by, ``x``'s own by default; a replica that holds one slice of a batch passes the whole batch's, so
    that the replicas' gradients sum to the batch's (see :mod:`accumrun.replicated_step`); an empty slice then
    gives zero gradients. It is not compiled by itself: call it inside a ``tf.function`` (as
    :func:`make_train_step` does) or eagerly in tests.

    When the batch's size is known at tracing (full batches, and every batch of a step compiled whole by XLA),
    the sub-batches of each size (the sizes differ by at most one) run in a loop of their own, so that every
    slice has a static shape: TensorFlow then runs the loop about 1.6x faster on small sub-batches, and XLA
    can compile it at all. The sum is the same, in another order. Otherwise (the short last batch, a replica's
    slice) one loop slices by index; with ``jit_compile`` each sub-batch's forward pass, backward pass and
    accumulation is then one XLA cluster, compiled once per sub-batch shape. ``scale_loss`` (a loss-scale
    optimizer's) multiplies each sub-batch's objective, so float16 gradients do not underflow; the gradients
    returned are then scaled by it too, and are accumulated in float32 whatever the compute dtype.
    """
    if subdivisions < 1:
        raise ValueError(f"subdivisions must be >= 1, got {subdivisions}")
    variables = model.trainable_variables

    def add_sub_batch(
        x_sub: tf.Tensor, y_sub: tf.Tensor, n_float: tf.Tensor, gradients: list[tf.Tensor]
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = model(x_sub, training=True)
            sub_loss_sum = tf.reduce_sum(loss_fn(y_sub, logits))
            objective = sub_loss_sum / n_float
            if model.losses:
                # Regularization belongs to the batch once; each sub-batch carries its share of it.
                share = tf.cast(tf.shape(x_sub)[0], tf.float32) / n_float
                objective += tf.cast(tf.add_n(model.losses), tf.float32) * share
            if scale_loss is not None:
                objective = scale_loss(objective)
        sub_gradients = tape.gradient(objective, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        gradients = [
            g + tf.cast(tf.convert_to_tensor(d), tf.float32) for g, d in zip(gradients, sub_gradients, strict=True)
        ]
        return gradients, sub_loss_sum, _correct_count(y_sub, logits)

    def accumulate_static(
        x: tf.Tensor, y: tf.Tensor, n_float: tf.Tensor
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        sizes = sub_batch_sizes(int(x.shape[0]), subdivisions)
        starts = [0, *itertools.accumulate(sizes[:-1])]
        gradients = [tf.zeros_like(v, dtype=tf.float32) for v in variables]
        loss_sum = tf.constant(0.0, tf.float32)
        correct = tf.constant(0, tf.int32)
        for size in sorted(set(sizes)):
            group = tf.constant([start for start, length in zip(starts, sizes, strict=True) if length == size])
            for start in group:
                tf.autograph.experimental.set_loop_options(parallel_iterations=PARALLEL_SUB_BATCHES)
                x_sub = tf.slice(x, [start] + [0] * (x.shape.rank - 1), [size] + [-1] * (x.shape.rank - 1))
                y_sub = tf.slice(y, [start], [size])
                gradients, sub_loss_sum, sub_correct = add_sub_batch(x_sub, y_sub, n_float, gradients)
                loss_sum += sub_loss_sum
                correct += sub_correct
        return gradients, loss_sum, correct

    clustered_sub_batch = tf.function(add_sub_batch, jit_compile=True, reduce_retracing=True) if jit_compile else None

    def accumulate(
        x: tf.Tensor, y: tf.Tensor, total: tf.Tensor | None = None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        if x.shape[0] is not None:
            return accumulate_static(x, y, tf.cast(x.shape[0] if total is None else total, tf.float32))
        sub_batch_step = clustered_sub_batch if jit_compile else add_sub_batch
        n = tf.shape(x)[0]
        s = tf.minimum(tf.constant(subdivisions, tf.int32), n)
        n_float = tf.cast(n if total is None else total, tf.float32)
        gradients = [tf.zeros_like(v, dtype=tf.float32) for v in variables]
        loss_sum = tf.constant(0.0, tf.float32)
        correct = tf.constant(0, tf.int32)
        # Autograph turns this into a tf.while_loop: no Python round-trip per sub-batch.
        for i in tf.range(s):
            # One iteration at a time: by default the loop may overlap up to 10 sub-batches, and with them their
            # activations, which is the memory that subdivisions exist to save.
            tf.autograph.experimental.set_loop_options(parallel_iterations=PARALLEL_SUB_BATCHES)
            start, end = i * n // s, (i + 1) * n // s
            gradients, sub_loss_sum, sub_correct = sub_batch_step(x[start:end], y[start:end], n_float, gradients)
            loss_sum += sub_loss_sum
            correct += sub_correct
        return gradients, loss_sum, correct

    return accumulate


def make_train_step(
    model: keras.Model,
    loss_fn: LossFn,
    optimizer: keras.optimizers.Optimizer,
    subdivisions: int,
    jit_compile: bool = False,
) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """Compile ``step(x, y) -> (loss_sum, correct, applied)``: accumulate over sub-batches, then update once.

    The optimizer sees one ``apply_gradients`` per call, so clipping, weight decay, its iteration counter and
    learning-rate schedules all count batches. ``applied`` is false when the loss or a gradient is NaN or Inf:
    that batch's update is not applied, so the weights and the optimizer state stay as they were and the caller
    decides whether to stop or go on. A ``keras.optimizers.LossScaleOptimizer`` scales each sub-batch's loss;
    it unscales and checks the accumulated gradients once per batch, skipping (and lowering its scale on) a
    batch whose scaled gradients overflowed, which ``applied`` reports too.

    The function traces at most twice per run: once for full batches and once, with a generalized shape, for a
    short last batch. ``jit_compile`` compiles the whole step with XLA, once per batch shape (see
    :func:`make_gradient_fn`).
    """
    variables = model.trainable_variables
    if not optimizer.built:  # a loss-scale optimizer would make its variables anew
        optimizer.build(variables)
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    scale_loss = optimizer.scale_loss if loss_scaled else None
    accumulate = make_gradient_fn(model, loss_fn, subdivisions, jit_compile, scale_loss)

    def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        gradients, loss_sum, correct = accumulate(x, y)
        if loss_scaled:
            # The loss-scale optimizer checks the gradients itself and skips the update on overflow.
            updates_before = tf.identity(optimizer.iterations)
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return loss_sum, correct, optimizer.iterations > updates_before
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in [loss_sum, *gradients]])

        def apply() -> tf.Tensor:
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return tf.constant(True)

        applied = tf.cond(finite, apply, lambda: tf.constant(False))
        return loss_sum, correct, applied

    # XLA needs static shapes, so a jit-compiled step keeps one trace per batch shape instead of generalizing.
    return tf.function(train_step, jit_compile=True) if jit_compile else tf.function(train_step, reduce_retracing=True)


def make_eval_step(
    model: keras.Model, loss_fn: LossFn
) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """Compile ``evaluate(x, y) -> (loss_sum, correct)`` in inference mode (BatchNorm uses moving stats)."""

    @tf.function(reduce_retracing=True)
    def eval_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        logits = model(x, training=False)
        return tf.reduce_sum(loss_fn(y, logits)), _correct_count(y, logits)

    return eval_step
