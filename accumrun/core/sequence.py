"""What happens around every batch's accumulation, written once for every step: where the per-replica parts run,
the reductions across replicas, and the decision to apply the update or skip it.

Across replicas (``tf.distribute``), every worker holds the same global batch of ``n`` samples (the data order
depends on the seed and the epoch alone). Replica ``r`` of ``R`` takes the contiguous slice
``[r*n//R, (r+1)*n//R)`` (see :mod:`accumrun.core.sub_batches`) and accumulates its sub-batches as on one device,
except that each sub-batch's loss sum is divided by ``n``, the *global* sample count. Summed over the replicas,
those local gradients are exactly the gradient of the batch's mean loss: the single-device update, for uneven
slices, the short last batch and empty slices too.

Where the replicas' sums happen. Called in a replica context, Keras' ``optimizer.apply_gradients`` all-reduces
(sums) the gradients itself (``_all_reduce_sum_gradients`` in ``keras/src/backend/tensorflow/optimizer.py``),
then updates every replica's copy of the variables identically. That is the batch's one gradient reduction,
after the sub-batch loop; this module sums gradients across replicas itself only for an observer that asks for the
batch's gradient (:mod:`accumrun.core.observers`), and never passes a summed gradient on, so the update sums them
exactly once. Before it, one small all-reduce carries the loss sum, how many replicas saw a NaN or Inf, and the
observers' state, so that every replica takes the same decision to apply the update or skip it: a replica that
skipped alone would leave the others waiting in the gradient all-reduce. That decision and the update run in the
cross-replica context, because ``tf.distribute`` forbids a ``tf.cond`` in a replica context around the
synchronization that ``apply_gradients`` does (Keras' ``LossScaleOptimizer`` takes the same route).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from accumrun.core.batch_norm import BatchNormStatistics, Moments
from accumrun.core.observers import BatchScale, Observers


class OneDevice:
    """Where a step without a strategy runs its per-replica parts: here, as the only replica."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def context(self) -> tf.distribute.ReplicaContext | None:
        return None

    def first_copy(self, values: Any) -> Any:
        return values


class Replicas:
    """Where a replicated step runs its per-replica parts: on every replica of ``strategy``."""

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        self.strategy = strategy

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.strategy.run(fn, args=args)

    def context(self) -> tf.distribute.ReplicaContext | None:
        return tf.distribute.get_replica_context()

    def first_copy(self, values: Any) -> Any:
        """Replica 0's copy of ``values``, which the all-reduces made the same on every replica."""
        return tf.nest.map_structure(lambda v: self.strategy.experimental_local_results(v)[0], values)


Placement = OneDevice | Replicas

ApplyOrSkip = Callable[[Any, tf.Tensor], tf.Tensor]
"""``apply_or_skip(gradients, finite) -> applied``: the update, or none, in the cross-replica context."""


class Accumulated(NamedTuple):
    """What each replica has after accumulating a batch: its own metric state from before the batch and
    gradients, and over every replica the batch's totals ``[loss_sum, replicas that saw a NaN or Inf]``, what its
    observers took of it (:meth:`~accumrun.core.observers.Observers.batch`) and its BatchNorm moments."""

    metrics_before: list[tf.Tensor]
    gradients: list[tf.Tensor]
    totals: tf.Tensor
    observed: Any
    moments: list[Moments]


class Finished(NamedTuple):
    """A batch after its update: the loss sum, whether the update was applied, and what its observers took of it,
    over every replica."""

    loss_sum: tf.Tensor
    applied: tf.Tensor
    observed: Any


class BatchSequence:
    """What happens around every batch's accumulation, in this order, whichever step runs it:

    1. the BatchNorm moving statistics are kept as they are (:meth:`start`);
    2. on each replica, the metrics' state is kept and the BatchNorm record emptied (:meth:`open`);
    3. the step accumulates the batch's gradients, its own piece;
    4. on each replica, the loss sum, the non-finite count, the observers' state and the BatchNorm moments are
       totalled over the replicas, and the observers take what they need of the batch (:meth:`close`);
    5. the update is applied, or skipped when anything was not finite, the same on every replica
       (``apply_or_skip``, the step's other piece), the metrics put back unless it was applied, and the BatchNorm
       statistics moved once, or not at all (:meth:`finish`).

    :meth:`run` does it all in one call. A streamed batch spreads it over several: 1 and 2 before its first
    sub-batch, 3 in one call per sub-batch, 4 and 5 in the call after its last.
    """

    def __init__(
        self,
        metric_state: list[tf.Variable],
        batch_norm: BatchNormStatistics,
        apply_or_skip: ApplyOrSkip,
        placement: Placement,
        observers: Observers,
    ) -> None:
        self._metric_state = metric_state
        self._batch_norm = batch_norm
        self._apply_or_skip = apply_or_skip
        self._placement = placement
        self._observers = observers

    def run(self, accumulate: Callable[..., tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]], *args: Any) -> Finished:
        """One batch through the whole sequence; ``accumulate(*args)`` runs on each replica."""
        self.start()

        def on_replica(*replica_args: Any) -> Accumulated:
            metrics_before = self.open()
            return self.close(metrics_before, *accumulate(*replica_args))

        return self.finish(self._placement.run(on_replica, *args))

    def start(self) -> None:
        """Keep the BatchNorm moving statistics, from which the batch's one update starts."""
        self._batch_norm.save()

    def open(self) -> list[tf.Tensor]:
        """On a replica, before accumulating: empty the BatchNorm record; return the metrics' state, to put back
        if the batch is skipped."""
        self._batch_norm.reset()
        return [tf.identity(v) for v in self._metric_state]

    def close(
        self, metrics_before: list[tf.Tensor], gradients: list[tf.Tensor], loss_sum: tf.Tensor, observed: tf.Tensor
    ) -> Accumulated:
        """On a replica, after accumulating: total the loss, the non-finite count, the observers' state and the
        BatchNorm moments over every replica (one small all-reduce, and BatchNorm's own), and let the observers take
        what they need of the batch."""
        context = self._placement.context()
        not_finite = tf.logical_not(_all_finite(loss_sum, gradients))
        totals = tf.stack([loss_sum, tf.cast(not_finite, loss_sum.dtype)])
        if self._observers:
            totals = tf.concat([totals, tf.cast(observed, loss_sum.dtype)], 0)
        if context is not None:
            totals = context.all_reduce(tf.distribute.ReduceOp.SUM, totals)
        taken = self._observers.batch(totals[2:], gradients, context) if self._observers else ()
        moments = self._batch_norm.batch_moments(context)
        return Accumulated(metrics_before, gradients, totals[:2], taken, moments)

    def finish(self, accumulated: Accumulated) -> Finished:
        """Apply or skip the update, put the metrics back unless it was applied, move the BatchNorm statistics."""
        totals, observed, moments = self._placement.first_copy(
            (accumulated.totals, accumulated.observed, accumulated.moments)
        )
        applied = self._apply_or_skip(accumulated.gradients, tf.equal(totals[1], 0.0))
        if self._metric_state:

            def put_back() -> tf.Tensor:
                self._placement.run(self._assign_metrics, accumulated.metrics_before)
                return tf.constant(True)

            # A skipped batch's samples are not counted.
            tf.cond(applied, lambda: tf.constant(True), put_back)
        self._batch_norm.update(moments, applied)
        return Finished(totals[0], applied, observed)

    def _assign_metrics(self, values: list[tf.Tensor]) -> None:
        for variable, value in zip(self._metric_state, values, strict=True):
            variable.assign(value)


def _all_finite(loss_sum: tf.Tensor, gradients: list[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in [loss_sum, *gradients]])


def apply_or_skip(
    optimizer: keras.optimizers.Optimizer, variables: list[tf.Variable], placement: Placement
) -> ApplyOrSkip:
    """The update of a batch whose gradients (on each replica) are finite; a loss-scale optimizer decides itself."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):

        def loss_scaled(gradients: list[tf.Tensor], finite: tf.Tensor) -> tf.Tensor:
            # It unscales and checks the gradients itself, and skips the update (lowering its scale) on overflow.
            updates_before = tf.identity(optimizer.iterations)
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return optimizer.iterations > updates_before

        return loss_scaled

    def update(gradients: list[tf.Tensor]) -> None:
        # On replicas, apply_gradients sums the replicas' gradients (the one gradient all-reduce), then updates.
        optimizer.apply_gradients(zip(gradients, variables, strict=True))

    def apply_if_finite(gradients: Any, finite: tf.Tensor) -> tf.Tensor:
        def apply() -> tf.Tensor:
            placement.run(update, gradients)
            return tf.constant(True)

        return tf.cond(finite, apply, lambda: tf.constant(False))

    return apply_if_finite


class BatchMeasures:
    """What a step measures of each batch beside its update: the results of its ``observers``, told the loss scale
    (``scale_loss``'s, a loss-scale optimizer's) that the gradients carry; without observers, nothing, at no cost."""

    def __init__(self, observers: Observers, scale_loss: Callable[[tf.Tensor], tf.Tensor] | None) -> None:
        self._observers = observers
        self._scale_loss = scale_loss

    def loss_scale(self) -> tf.Tensor:
        """The loss scale now (read before the update, which may change it)."""
        if self._scale_loss is None or not self._observers:
            return tf.constant(1.0)
        return tf.cast(self._scale_loss(tf.constant(1.0)), tf.float32)

    def __call__(self, finished: Finished, divided_by: tf.Tensor, units: tf.Tensor, loss_scale: tf.Tensor) -> tf.Tensor:
        """The batch's measures, its sub-batches' loss sums having been divided by ``divided_by``."""
        return self._observers.results(finished.observed, BatchScale(divided_by, units, loss_scale))
