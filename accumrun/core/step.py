"""The accumulation step: one compiled call per batch, one optimizer update per batch.

The rule: a batch of ``n`` samples is cut into ``s = min(subdivisions, n)`` sub-batches (see
:mod:`accumrun.core.split`). Each sub-batch runs forward and backward on the *sum* of its per-sample losses divided
by ``n``, the whole batch's sample count. Summing those gradients over the sub-batches therefore gives exactly
the gradient of the batch's mean loss, however unevenly the batch splits: it is the sample-weighted mean of the
sub-batch mean gradients. Recipes that average the ``s`` sub-batch means (divide by ``s``) are wrong whenever
the sub-batches differ in size.

All sub-batches run inside one ``tf.function`` (autograph ``tf.while_loop`` loops: one, or one per sub-batch
size when the batch's shape is static), slicing the batch where it already lives, on the device. Only one
sub-batch's activations are alive at a time; the extra memory is one accumulator per trainable variable.

Across replicas (``tf.distribute``), every worker holds the same global batch of ``n`` samples (the data order
depends on the seed and the epoch alone). Replica ``r`` of ``R`` takes the contiguous slice
``[r*n//R, (r+1)*n//R)`` (see :mod:`accumrun.core.split`) and accumulates its sub-batches as on one device,
except that each sub-batch's loss sum is divided by ``n``, the *global* sample count. Summed over the replicas,
those local gradients are exactly the gradient of the batch's mean loss: the single-device update, for uneven
slices, the short last batch and empty slices too.

Where the replicas' sums happen. Called in a replica context, Keras' ``optimizer.apply_gradients`` all-reduces
(sums) the gradients itself (``_all_reduce_sum_gradients`` in ``keras/src/backend/tensorflow/optimizer.py``),
then updates every replica's copy of the variables identically. That is the batch's one gradient reduction,
after the sub-batch loop; this module never sums gradients across replicas itself, so they are summed exactly
once. Before it, one small all-reduce of two numbers carries the loss sum and how many replicas saw a NaN or
Inf, so that every replica takes the same decision to apply the update or skip it: a
replica that skipped alone would leave the others waiting in the gradient all-reduce. That decision and the
update run in the cross-replica context, because ``tf.distribute`` forbids a ``tf.cond`` in a replica context
around the synchronization that ``apply_gradients`` does (Keras' ``LossScaleOptimizer`` takes the same route).

This module knows nothing of configs, files or the command line.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import LossFn, MetricSet, Objective
from accumrun.core.seeds import SubBatchSeeds
from accumrun.core.split import sub_batch_sizes

Step = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
"""``step(x, y) -> (loss_sum, applied)``: one batch, one update (see :class:`TrainStep`)."""

# How many sub-batches the loop may run at once (TensorFlow's default is 10). More is faster on tiny sub-batches
# but holds that many sub-batches' activations; benchmarks/step_speed.py --parallel measures it.
PARALLEL_SUB_BATCHES = 1


def _slice_rows(x: tf.Tensor, y: tf.Tensor, size: int, start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Rows ``[start, start + size)`` of ``x`` and ``y``, with the static size ``size``, and ``start``."""
    return _rows(x, start, size), _rows(y, start, size), start


def _rows(t: tf.Tensor, start: tf.Tensor, size: int) -> tf.Tensor:
    rank = t.shape.rank
    return tf.slice(t, [start] + [0] * (rank - 1), [size] + [-1] * (rank - 1))


Totals = tuple[list[tf.Tensor], tf.Tensor]
"""``(gradients, loss_sum)`` accumulated so far."""


def make_gradient_fn(
    model: keras.Model,
    loss: Objective | LossFn,
    subdivisions: int,
    jit_compile: bool = False,
    scale_loss: Callable[[tf.Tensor], tf.Tensor] | None = None,
    metrics: MetricSet | None = None,
    batch_norm: BatchNormStatistics | None = None,
    seeds: SubBatchSeeds | None = None,
) -> Callable[..., Totals]:
    """A function ``(x, y, total=None) -> (gradients, loss_sum)`` that accumulates over the sub-batches.

    ``gradients`` is the gradient of the batch's mean loss (plus the model's regularization losses) with
    respect to ``model.trainable_variables``; ``loss_sum`` is the sum of the per-sample losses. ``metrics``, when
    given, are updated with every sub-batch's samples. ``total`` is the sample count that the losses are divided
    by, ``x``'s own by default; a replica that holds one slice of a batch passes the whole batch's, so that the
    replicas' gradients sum to the batch's (see :func:`make_train_step`); an empty slice then gives zero
    gradients. It is not compiled by itself: call it inside a ``tf.function`` (as :func:`make_train_step` does)
    or eagerly in tests.

    When the batch's size is known at tracing (full batches, and every batch of a step compiled whole by XLA),
    the sub-batches of each size (the sizes differ by at most one) run in a loop of their own, so that every
    slice has a static shape: TensorFlow then runs the loop about 1.6x faster on small sub-batches, and XLA
    can compile it at all. The sum is the same, in another order. Otherwise (the short last batch, a replica's
    slice) one loop slices by index; with ``jit_compile`` each sub-batch's forward pass, backward pass and
    accumulation is then one XLA cluster, compiled once per sub-batch shape. ``scale_loss`` (a loss-scale
    optimizer's) multiplies each sub-batch's objective, so float16 gradients do not underflow; the gradients
    returned are then scaled by it too, and are accumulated in float32 whatever the compute dtype.
    ``batch_norm`` sets what the BatchNorm layers do in the forward passes, and records each sub-batch's moments
    for a per-batch update of their moving statistics (see :mod:`accumrun.core.batch_norm`). ``seeds`` gives each
    sub-batch's random layers (dropout) draws of their own (see :mod:`accumrun.core.seeds`); ``first_row`` is
    where ``x`` starts in the batch, for a sub-batch streamed in a call of its own.
    """
    if subdivisions < 1:
        raise ValueError(f"subdivisions must be >= 1, got {subdivisions}")
    objective = loss if isinstance(loss, Objective) else Objective(loss)
    variables = model.trainable_variables

    def add_sub_batch(
        x_sub: tf.Tensor, y_sub: tf.Tensor, first_row: tf.Tensor, n_float: tf.Tensor, gradients: list[tf.Tensor]
    ) -> Totals:
        if seeds:
            seeds.reseed(first_row)
        with tf.GradientTape() as tape:
            # Runs while the step is traced: the BatchNorm layers are traced as the mode says.
            with batch_norm.tracing() if batch_norm is not None else contextlib.nullcontext():
                predictions = model(x_sub, training=True)
            sub_loss_sum = tf.reduce_sum(objective.per_sample_loss(y_sub, predictions))
            batch_share = sub_loss_sum / n_float
            if model.losses:
                # Regularization belongs to the batch once; each sub-batch carries its share of it.
                share = tf.cast(tf.shape(x_sub)[0], tf.float32) / n_float
                batch_share += tf.cast(tf.add_n(model.losses), tf.float32) * share
            if scale_loss is not None:
                batch_share = scale_loss(batch_share)
        sub_gradients = tape.gradient(batch_share, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        if metrics is not None:
            metrics.update(y_sub, predictions)
        if batch_norm is not None and batch_norm.records:
            batch_norm.record(tf.shape(x_sub)[0])
        gradients = [
            g + tf.cast(tf.convert_to_tensor(d), tf.float32) for g, d in zip(gradients, sub_gradients, strict=True)
        ]
        return gradients, sub_loss_sum

    def sum_sub_batches(
        indices: tf.Tensor,
        cut: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor]],
        add: Callable[..., Totals],
        n_float: tf.Tensor,
        totals: Totals,
        offset: tf.Tensor,
    ) -> Totals:
        """Add the sub-batches ``cut(i)`` for ``i`` in ``indices`` to ``totals``; autograph makes the loop a
        ``tf.while_loop``, so there is no Python round-trip per sub-batch."""
        gradients, loss_sum = totals
        for i in indices:
            # One iteration at a time: by default the loop may overlap up to 10 sub-batches, and with them their
            # activations, which is the memory that subdivisions exist to save.
            tf.autograph.experimental.set_loop_options(parallel_iterations=PARALLEL_SUB_BATCHES)
            x_sub, y_sub, first_row = cut(i)
            gradients, sub_loss_sum = add(x_sub, y_sub, offset + first_row, n_float, gradients)
            loss_sum += sub_loss_sum
        return gradients, loss_sum

    clustered_sub_batch = tf.function(add_sub_batch, jit_compile=True, reduce_retracing=True) if jit_compile else None

    def accumulate(
        x: tf.Tensor, y: tf.Tensor, total: tf.Tensor | None = None, first_row: tf.Tensor | int = 0
    ) -> Totals:
        totals: Totals = ([tf.zeros_like(v, dtype=tf.float32) for v in variables], tf.constant(0.0, tf.float32))
        if x.shape[0] is not None:
            # Static shapes: one loop per sub-batch size, each slicing a fixed size at a list of starts.
            n_float = tf.cast(x.shape[0] if total is None else total, tf.float32)
            sizes = sub_batch_sizes(int(x.shape[0]), subdivisions)
            starts = [0, *itertools.accumulate(sizes[:-1])]
            for size in sorted(set(sizes)):
                group = tf.constant([start for start, length in zip(starts, sizes, strict=True) if length == size])
                totals = sum_sub_batches(
                    group, functools.partial(_slice_rows, x, y, size), add_sub_batch, n_float, totals, first_row
                )
            return totals
        n = tf.shape(x)[0]
        s = tf.minimum(tf.constant(subdivisions, tf.int32), n)
        n_float = tf.cast(n if total is None else total, tf.float32)

        def cut(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            start, end = i * n // s, (i + 1) * n // s
            return x[start:end], y[start:end], start

        return sum_sub_batches(tf.range(s), cut, clustered_sub_batch or add_sub_batch, n_float, totals, first_row)

    return accumulate


class TrainStep:
    """One batch, one update: ``step(x, y) -> (loss_sum, applied)`` runs a whole batch in one compiled call.

    When the batch does not fit on the device at once, its sub-batches can be streamed instead:
    ``accumulate(x_sub, y_sub, batch_samples)`` adds one sub-batch to accumulators that persist between calls
    (one compiled call each), and ``apply()`` makes the batch's one update, clears them and returns what a
    whole-batch call returns. Each sub-batch's
    loss sum is divided by ``batch_samples``, the whole batch's count, so the update is the same as
    ``step(x, y)`` on the batch, to float rounding.
    """

    def __init__(
        self,
        compiled: Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]],
        sub_batch_gradients: Callable[..., Totals] | None,
        apply_or_skip: Callable[[list[tf.Tensor], tf.Tensor], tf.Tensor],
        variables: list[tf.Variable],
        metric_state: list[tf.Variable],
        jit_compile: bool,
        batch_norm: BatchNormStatistics | None = None,
    ) -> None:
        self.compiled = compiled
        """The compiled whole-batch step (a ``tf.function``)."""
        self._sub_batch_gradients = sub_batch_gradients
        self._apply_or_skip = apply_or_skip
        self._variables = variables
        self._metric_state = metric_state
        self._jit_compile = jit_compile
        self._batch_norm = batch_norm
        self._streamed: _StreamedBatch | None = None

    def __call__(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return self.compiled(x, y)

    def accumulate(self, x: tf.Tensor, y: tf.Tensor, batch_samples: int) -> tf.Tensor:
        """Add one streamed sub-batch of a batch of ``batch_samples``; return its loss sum.

        Raises:
            ValueError: the step is replicated (streaming runs on one device).
        """
        if self._sub_batch_gradients is None:
            raise ValueError("streamed sub-batches run on one device; this step is replicated")
        if self._streamed is None:
            self._streamed = _StreamedBatch(
                self._sub_batch_gradients,
                self._apply_or_skip,
                self._variables,
                self._metric_state,
                self._jit_compile,
                self._batch_norm,
            )
        return self._streamed.add(x, y, batch_samples)

    def apply(self) -> tuple[tf.Tensor, tf.Tensor]:
        """Update once with the accumulated gradients (or skip a non-finite batch); return the batch's
        ``(loss_sum, applied)``, as a whole-batch call does."""
        if self._streamed is None or not self._streamed.pending:
            raise ValueError("apply() needs accumulate() first: no sub-batch has been added since the last update")
        return self._streamed.apply()


class _StreamedBatch:
    """The accumulators of a streamed batch: variables, so they persist between compiled calls."""

    def __init__(
        self,
        sub_batch_gradients: Callable[..., Totals],
        apply_or_skip: Callable[[list[tf.Tensor], tf.Tensor], tf.Tensor],
        variables: list[tf.Variable],
        metric_state: list[tf.Variable],
        jit_compile: bool,
        batch_norm: BatchNormStatistics | None,
    ) -> None:
        self._metric_state = metric_state
        self._batch_norm = batch_norm if batch_norm is not None and batch_norm.records else None
        with tf.init_scope():
            self._gradients = [tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False) for v in variables]
            self._loss_sum = tf.Variable(0.0, trainable=False)
            self._metrics_before = [tf.Variable(v, trainable=False) for v in metric_state]
        self.pending = False
        self._rows = 0
        """Rows of the batch streamed so far: where the next sub-batch starts."""

        def add(x: tf.Tensor, y: tf.Tensor, total: tf.Tensor, first_row: tf.Tensor) -> tf.Tensor:
            gradients, loss_sum = sub_batch_gradients(x, y, total, first_row)
            for accumulator, gradient in zip(self._gradients, gradients, strict=True):
                accumulator.assign_add(gradient)
            self._loss_sum.assign_add(loss_sum)
            return loss_sum

        def apply() -> tuple[tf.Tensor, tf.Tensor]:
            gradients = [tf.identity(g) for g in self._gradients]
            loss_sum = tf.identity(self._loss_sum)
            applied = apply_or_skip(gradients, loss_sum)
            _restore_unless(applied, metric_state, self._metrics_before)
            if self._batch_norm is not None:
                self._batch_norm.update(self._batch_norm.batch_moments(), applied)
            for accumulator in self._gradients:
                accumulator.assign(tf.zeros_like(accumulator))
            self._loss_sum.assign(0.0)
            return loss_sum, applied

        self._add = tf.function(add, jit_compile=jit_compile or None, reduce_retracing=True)
        self._apply = tf.function(apply)

    def add(self, x: tf.Tensor, y: tf.Tensor, batch_samples: int) -> tf.Tensor:
        if not self.pending:
            # The metrics as they were before the batch, to put back if its update is skipped.
            for saved, variable in zip(self._metrics_before, self._metric_state, strict=True):
                saved.assign(variable)
            if self._batch_norm is not None:
                self._batch_norm.save()
                self._batch_norm.reset()
            self.pending = True
            self._rows = 0
        loss_sum = self._add(x, y, tf.constant(batch_samples, tf.int32), tf.constant(self._rows, tf.int32))
        self._rows += int(x.shape[0])
        return loss_sum

    def apply(self) -> tuple[tf.Tensor, tf.Tensor]:
        self.pending = False
        return self._apply()


def make_train_step(
    model: keras.Model,
    loss: Objective | LossFn,
    optimizer: keras.optimizers.Optimizer,
    subdivisions: int,
    *,
    metrics: MetricSet | None = None,
    strategy: tf.distribute.Strategy | None = None,
    jit_compile: bool = False,
    batch_norm: BatchNormStatistics | None = None,
    seeds: SubBatchSeeds | None = None,
) -> TrainStep:
    """Compile the :class:`TrainStep`: accumulate over sub-batches, then update once.

    The optimizer sees one ``apply_gradients`` per batch, so clipping, weight decay, its iteration counter and
    learning-rate schedules all count batches. ``applied`` is false when the loss or a gradient is NaN or Inf:
    that batch's update is not applied, so the weights, the optimizer state and the ``metrics`` stay as they
    were and the caller decides whether to stop or go on. A ``keras.optimizers.LossScaleOptimizer`` scales each
    sub-batch's loss; it unscales and checks the accumulated gradients once per batch, skipping (and lowering
    its scale on) a batch whose scaled gradients overflowed, which ``applied`` reports too.

    ``loss`` is an :class:`~accumrun.core.losses.Objective`, or a bare per-sample loss of class indices.
    ``metrics`` (from ``objective.new_metrics()``) are updated with every sub-batch's samples. ``batch_norm``
    (created in the strategy's scope) sets the BatchNorm mode; with ``per_batch`` or ``precise`` the moving
    statistics move once per batch, from the batch's moments over every sub-batch and replica, or not at all
    when the batch is skipped. Without it, Keras' own behaviour holds (``sub_batch``). ``seeds`` makes every
    sub-batch of every replica draw its own dropout masks, as a function of the update.

    With a ``strategy`` (the model, optimizer and metrics created in its scope), the global batch ``(x, y)`` is
    dealt out to the replicas, each runs its sub-batches in a loop, and the two all-reduces and the update follow
    once (see the module's docstring); ``loss_sum`` is over the whole batch, and ``applied`` is false when any
    replica saw a NaN or Inf. Loss scaling runs on one device only, and so do streamed sub-batches.

    The whole-batch call traces at most twice per run: once for full batches and once, with a generalized shape,
    for a short last batch. ``jit_compile`` compiles it with XLA, once per batch shape (per sub-batch under a
    strategy; see :func:`make_gradient_fn`).

    Raises:
        ValueError: ``subdivisions`` is below 1, or a loss-scale optimizer is given with a strategy.
    """
    variables = model.trainable_variables
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if strategy is not None and loss_scaled:
        raise ValueError("a LossScaleOptimizer runs on one device only; the replicated step does not scale the loss")
    if not optimizer.built:  # a loss-scale optimizer would make its variables anew
        if strategy is None:
            optimizer.build(variables)
        else:
            with strategy.scope():
                optimizer.build(variables)
    scale_loss = optimizer.scale_loss if loss_scaled else None
    accumulate = make_gradient_fn(model, loss, subdivisions, jit_compile, scale_loss, metrics, batch_norm, seeds)
    metric_state = metrics.variables if metrics is not None else []
    recording = batch_norm if batch_norm is not None and batch_norm.records else None

    def apply_or_skip(gradients: list[tf.Tensor], loss_sum: tf.Tensor) -> tf.Tensor:
        """Apply ``gradients`` unless they or the loss are not finite; return whether they were applied."""
        if loss_scaled:
            # The loss-scale optimizer checks the gradients itself and skips the update on overflow.
            updates_before = tf.identity(optimizer.iterations)
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return optimizer.iterations > updates_before

        def apply() -> tf.Tensor:
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return tf.constant(True)

        return tf.cond(_all_finite(loss_sum, gradients), apply, lambda: tf.constant(False))

    if strategy is not None:
        compiled = _replicated_step(strategy, accumulate, optimizer, variables, metric_state, recording)
        return TrainStep(compiled, None, apply_or_skip, variables, metric_state, jit_compile)

    def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        metrics_before = [tf.identity(v) for v in metric_state]
        if recording is not None:
            recording.save()
            recording.reset()
        gradients, loss_sum = accumulate(x, y)
        applied = apply_or_skip(gradients, loss_sum)
        _restore_unless(applied, metric_state, metrics_before)
        if recording is not None:
            recording.update(recording.batch_moments(), applied)
        return loss_sum, applied

    # XLA needs static shapes, so a jit-compiled step keeps one trace per batch shape instead of generalizing.
    if jit_compile:
        compiled = tf.function(train_step, jit_compile=True)
    else:
        compiled = tf.function(train_step, reduce_retracing=True)
    # A streamed sub-batch is a batch of one subdivision, its losses divided by the whole batch's count.
    one_sub_batch = make_gradient_fn(model, loss, 1, False, scale_loss, metrics, batch_norm, seeds)
    return TrainStep(compiled, one_sub_batch, apply_or_skip, variables, metric_state, jit_compile, batch_norm)


def _all_finite(loss_sum: tf.Tensor, gradients: list[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in [loss_sum, *gradients]])


def _restore_unless(applied: tf.Tensor, variables: list[tf.Variable], values: list[tf.Tensor]) -> None:
    """Put ``values`` back into ``variables`` when the batch was skipped: its samples are not counted."""
    if not variables:
        return

    def restore() -> tf.Tensor:
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
        return tf.constant(True)

    tf.cond(applied, lambda: tf.constant(True), restore)


def _replicated_step(
    strategy: tf.distribute.Strategy,
    accumulate: Callable[..., Totals],
    optimizer: keras.optimizers.Optimizer,
    variables: list[tf.Variable],
    metric_state: list[tf.Variable],
    batch_norm: BatchNormStatistics | None,
) -> Step:
    """The step of :func:`make_train_step` over the replicas of ``strategy``."""
    replicas = strategy.num_replicas_in_sync

    def replica_gradients(x: tf.Tensor, y: tf.Tensor, total: tf.Tensor) -> tuple[Any, ...]:
        # Each replica's own metric state (synchronized on read), to put back if the batch is skipped.
        metrics_before = [tf.identity(v) for v in metric_state]
        if batch_norm is not None:
            batch_norm.reset()
        gradients, loss_sum = accumulate(x, y, total)
        not_finite = tf.logical_not(_all_finite(loss_sum, gradients))
        local = tf.stack([loss_sum, tf.cast(not_finite, tf.float32)])
        context = tf.distribute.get_replica_context()
        totals = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
        # The batch's BatchNorm moments over every replica: the same on each, like the totals.
        moments = batch_norm.batch_moments(context) if batch_norm is not None else []
        return gradients, totals, metrics_before, moments

    def replica_update(gradients: list[tf.Tensor]) -> None:
        # apply_gradients sums the replicas' gradients (the one gradient all-reduce), then updates.
        optimizer.apply_gradients(zip(gradients, variables, strict=True))

    def replica_restore(values: list[tf.Tensor]) -> None:
        for variable, value in zip(metric_state, values, strict=True):
            variable.assign(value)

    @tf.function(reduce_retracing=True)
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        total = tf.shape(x)[0]

        def replica_slice(context: tf.distribute.experimental.ValueContext) -> tuple[tf.Tensor, tf.Tensor]:
            r = context.replica_id_in_sync_group
            start, end = r * total // replicas, (r + 1) * total // replicas
            return x[start:end], y[start:end]

        x_parts, y_parts = strategy.experimental_distribute_values_from_function(replica_slice)
        if batch_norm is not None:
            batch_norm.save()
        gradients, totals, metrics_before, moments = strategy.run(replica_gradients, args=(x_parts, y_parts, total))
        # After the all-reduces every replica holds the same totals and moments; any local copy will do.
        totals, moments = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], (totals, moments))

        def update() -> tf.Tensor:
            strategy.run(replica_update, args=(gradients,))
            return tf.constant(True)

        def skip() -> tf.Tensor:
            if metric_state:
                strategy.run(replica_restore, args=(metrics_before,))
            return tf.constant(False)

        applied = tf.cond(tf.equal(totals[1], 0.0), update, skip)
        if batch_norm is not None:
            batch_norm.update(moments, applied)
        return totals[0], applied

    return train_step


def make_eval_step(
    model: keras.Model, loss: Objective | LossFn, metrics: MetricSet | None = None
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """Compile ``evaluate(x, y) -> loss_sum`` in inference mode (BatchNorm uses its moving statistics); it adds
    the samples to ``metrics``."""
    objective = loss if isinstance(loss, Objective) else Objective(loss)

    @tf.function(reduce_retracing=True)
    def eval_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        predictions = model(x, training=False)
        if metrics is not None:
            metrics.update(y, predictions)
        return tf.reduce_sum(objective.per_sample_loss(y, predictions))

    return eval_step
