"""The accumulation step across replicas (``tf.distribute``): sub-batches on each replica, one update per batch.

Every worker holds the same global batch of ``n`` samples (the data order depends on the seed and the epoch
alone). Replica ``r`` of ``R`` takes the contiguous slice ``[r*n//R, (r+1)*n//R)`` (see :mod:`accumrun.split`)
and accumulates its sub-batches as on one device (:func:`accumrun.step.make_gradient_fn`), except that each
sub-batch's loss sum is divided by ``n``, the *global* sample count. Summed over the replicas, those local
gradients are exactly the gradient of the batch's mean loss: the single-device update, for uneven slices, the
short last batch and empty slices too.

Where the sums happen. Called in a replica context, Keras' ``optimizer.apply_gradients`` all-reduces (sums) the
gradients itself (``_all_reduce_sum_gradients`` in ``keras/src/backend/tensorflow/optimizer.py``), then updates
every replica's copy of the variables identically. That is the batch's one gradient reduction, after the
sub-batch loop; this module never sums gradients itself, so they are summed exactly once. Before it, one small
all-reduce of three numbers carries the loss sum, the correct count and how many replicas saw a NaN or Inf, so
that every replica takes the same decision to apply the update or skip it: a replica that skipped alone would
leave the others waiting in the gradient all-reduce. That decision and the update run in the cross-replica
context, because ``tf.distribute`` forbids a ``tf.cond`` in a replica context around the synchronization that
``apply_gradients`` does (Keras' ``LossScaleOptimizer`` takes the same route).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from accumrun.step import LossFn, make_gradient_fn


def make_replicated_train_step(
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    loss_fn: LossFn,
    optimizer: keras.optimizers.Optimizer,
    subdivisions: int,
    jit_compile: bool = False,
) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """Compile ``step(x, y) -> (loss_sum, correct, applied)`` over the replicas of ``strategy``.

    The contract of :func:`accumrun.step.make_train_step`, for a global batch ``(x, y)``: ``loss_sum`` and
    ``correct`` are over the whole batch, and ``applied`` is false (and nothing changed) when the loss or a
    gradient is NaN or Inf on any replica. The model and the optimizer must have been created in
    ``strategy.scope()``. One call per batch: the batch is dealt out to the replicas, each replica runs its
    sub-batches in a ``tf.while_loop``, and the two all-reduces and the update follow once.
    """
    variables = model.trainable_variables
    if not optimizer.built:
        with strategy.scope():
            optimizer.build(variables)
    accumulate = make_gradient_fn(model, loss_fn, subdivisions, jit_compile)
    replicas = strategy.num_replicas_in_sync

    def replica_gradients(x: tf.Tensor, y: tf.Tensor, total: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor]:
        gradients, loss_sum, correct = accumulate(x, y, total)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in [loss_sum, *gradients]])
        # float32 counts are exact up to 2**24 correct samples per batch.
        local = tf.stack([loss_sum, tf.cast(correct, tf.float32), tf.cast(tf.logical_not(finite), tf.float32)])
        totals = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
        return gradients, totals

    def replica_update(gradients: list[tf.Tensor]) -> None:
        # apply_gradients sums the replicas' gradients (the one gradient all-reduce), then updates.
        optimizer.apply_gradients(zip(gradients, variables, strict=True))

    @tf.function(reduce_retracing=True)
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        total = tf.shape(x)[0]

        def replica_slice(context: tf.distribute.experimental.ValueContext) -> tuple[tf.Tensor, tf.Tensor]:
            r = context.replica_id_in_sync_group
            start, end = r * total // replicas, (r + 1) * total // replicas
            return x[start:end], y[start:end]

        x_parts, y_parts = strategy.experimental_distribute_values_from_function(replica_slice)
        gradients, totals = strategy.run(replica_gradients, args=(x_parts, y_parts, total))
        # After the all-reduce every replica holds the same totals; any local copy will do.
        totals = strategy.experimental_local_results(totals)[0]

        def update() -> tf.Tensor:
            strategy.run(replica_update, args=(gradients,))
            return tf.constant(True)

        applied = tf.cond(tf.equal(totals[2], 0.0), update, lambda: tf.constant(False))
        return totals[0], tf.cast(totals[1], tf.int32), applied

    return train_step
