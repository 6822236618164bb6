"""The train step: one optimizer update per batch, however the batch arrives.

The pieces, each in its module, put together here by :func:`make_train_step` from one frozen
:class:`~accumrun.core.spec.StepSpec`:

- accumulation (:mod:`accumrun.core.accumulation`): a batch's gradient as the sum of its sub-batches', each
  sub-batch's loss sum divided by the whole batch's units, in a ``tf.while_loop`` on the device;
- what happens around every batch's accumulation (:mod:`accumrun.core.sequence`): replicas, their reductions, and
  the decision to apply the update or skip it (a NaN or Inf, a loss-scale overflow), the same on every replica;
- observers (:mod:`accumrun.core.observers`): what the step measures of each batch from its sub-batches (the
  gradient noise scale is one, :mod:`accumrun.core.noise`), run the same way whatever they measure; without any,
  the step computes nothing for them;
- the two steps, behind one interface, :meth:`~accumrun.core.spec.TrainStep.train_batch`: :class:`WholeBatchStep`
  runs a whole batch in one compiled call, on one device or on the replicas of a strategy, so there is no Python
  round-trip per sub-batch; :class:`~accumrun.core.streamed.StreamedStep` takes a batch that does not fit on the
  device as its sub-batches, one compiled call each, into accumulators that persist between calls, and makes the
  update in one more call.

This package knows nothing of configs, files or the command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import keras
import tensorflow as tf

from accumrun.core.accumulation import Accumulation, make_gradient_fn
from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import LossFn, Objective
from accumrun.core.observers import Observers
from accumrun.core.sequence import BatchMeasures, BatchSequence, OneDevice, Placement, Replicas, apply_or_skip
from accumrun.core.spec import BatchResult, Chunk, StepSpec, TrainStep, step_spec
from accumrun.core.streamed import StreamedStep
from accumrun.core.sub_batches import part_bounds, replica_rows
from accumrun.core.targets import Targets
from accumrun.kinds import BatchNormMode, Feed


class WholeBatchStep(TrainStep):
    """One batch, one compiled call: ``step(x, y) -> BatchResult``, on one device or on the replicas of a strategy;
    the batch is cut into its sub-batches on the device.

    The call traces at most twice per run: once for full batches and once, with a generalized shape, for a short
    last batch. Compiled with XLA (``jit_compile``), it traces once per batch shape instead, and under a strategy
    each sub-batch is compiled on its own (see :func:`make_gradient_fn`).
    """

    def __init__(self, compiled: Callable[[tf.Tensor, Targets], BatchResult], observers: Observers) -> None:
        self.compiled = compiled
        """The compiled step (a ``tf.function``)."""
        self.observers = observers
        """What it measures of each batch: the columns of :attr:`~accumrun.core.spec.BatchResult.measures`."""

    def __call__(self, x: tf.Tensor, y: Targets) -> BatchResult:
        return BatchResult(*self.compiled(x, y))

    def train_batch(self, chunks: Iterable[Chunk], samples: int) -> BatchResult:
        """Train the batch that ``chunks`` holds as its one chunk (it has all ``samples`` samples)."""
        ((x, y),) = chunks
        return self(x, y)


def make_train_step(
    model: keras.Model,
    loss: Objective | LossFn,
    optimizer: keras.optimizers.Optimizer,
    spec: StepSpec | int,
    **fields: Any,
) -> TrainStep:
    """Compile the train step that ``spec`` describes: accumulate over sub-batches, then update once.

    ``spec`` is a :class:`StepSpec`, or a subdivision count; ``fields`` replace any of its fields (see
    :func:`~accumrun.core.spec.step_spec`), so ``make_train_step(model, loss, optimizer, 3, feed=Feed.SUB_BATCH)``
    reads as it says.

    The optimizer sees one ``apply_gradients`` per batch, so clipping, weight decay, its iteration counter and
    learning-rate schedules all count batches. A batch whose loss or gradient is NaN or Inf is not applied: the
    weights, the optimizer state and the metrics stay as they were, and the caller decides whether to stop
    or go on. A ``keras.optimizers.LossScaleOptimizer`` scales each sub-batch's loss; it unscales and checks the
    accumulated gradients once per batch, and skips (lowering its scale) a batch whose gradients overflowed.

    ``spec.feed`` is how batches arrive: whole (a :class:`WholeBatchStep`, which cuts them into
    ``spec.subdivisions``), or as the sub-batches the caller cut (a :class:`~accumrun.core.streamed.StreamedStep`).
    ``loss`` is an :class:`~accumrun.core.losses.Objective`, or a bare per-sample loss of class indices.
    ``spec.metrics`` are updated with every sub-batch's samples. With ``per_batch`` or ``precise`` BatchNorm
    statistics (``spec.batch_norm``) the moving statistics move once per batch, from the batch's moments over every
    sub-batch and replica, or not at all when the batch is skipped. ``spec.draws`` has the random layers draw each
    sample's masks from the update and its row in the global batch, whatever the subdivisions, feed and replicas.
    With ``spec.strategy``, the global batch is dealt out to the replicas (see :mod:`accumrun.core.sequence`).
    ``spec.observers`` measure each batch beside its update (see :mod:`accumrun.core.observers`).
    ``spec.jit_compile`` compiles with XLA (see :class:`WholeBatchStep` and
    :func:`~accumrun.core.accumulation.make_gradient_fn`). ``spec.bucket`` pads each sub-batch of token ids only to
    its longest sequence, rounded up to a multiple of it (the model must take any length).

    Raises:
        ValueError: a strategy with streamed sub-batches or a loss-scale optimizer (a replicated step has neither)
    """
    spec = step_spec(spec, **fields)
    strategy = spec.strategy
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if strategy is not None and (spec.feed is Feed.SUB_BATCH or loss_scaled):
        raise ValueError("the replicated step runs whole batches, without loss scaling")
    variables = model.trainable_variables
    if not optimizer.built:  # a loss-scale optimizer would make its variables anew
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            optimizer.build(variables)
    placement: Placement = Replicas(strategy) if strategy is not None else OneDevice()
    if spec.batch_norm is None:
        spec = dataclasses.replace(spec, batch_norm=BatchNormStatistics(model, BatchNormMode.SUB_BATCH))
    assert spec.batch_norm is not None
    metric_state = spec.metrics.variables if spec.metrics is not None else []
    observers = Observers(spec.observers)
    sequence = BatchSequence(
        metric_state, spec.batch_norm, apply_or_skip(optimizer, variables, placement), placement, observers
    )
    scale_loss = optimizer.scale_loss if loss_scaled else None
    measure = BatchMeasures(observers, scale_loss)
    if spec.feed is Feed.SUB_BATCH:
        # A streamed sub-batch is a batch of one subdivision, its losses divided by the whole batch's count; the
        # step compiles each sub-batch's call whole, with XLA when asked.
        sub_batch = make_gradient_fn(model, loss, spec, scale_loss=scale_loss, subdivisions=1, jit_compile=False)
        return StreamedStep(sequence, sub_batch, variables, measure, jit_compile=spec.jit_compile)
    accumulate = make_gradient_fn(model, loss, spec, scale_loss=scale_loss)
    if strategy is not None:
        return _replicated_step(strategy, sequence, accumulate, measure)
    return _one_device_step(sequence, accumulate, measure, jit_compile=spec.jit_compile)


def _one_device_step(
    sequence: BatchSequence, accumulate: Accumulation, measure: BatchMeasures, *, jit_compile: bool
) -> WholeBatchStep:
    """The whole-batch step on one device."""

    def train_step(x: tf.Tensor, y: Targets) -> tuple[tf.Tensor, ...]:
        units = accumulate.units(y)
        loss_scale = measure.loss_scale()
        finished = sequence.run(accumulate, x, y, units)
        return finished.loss_sum, units, finished.applied, measure(finished, units, units, loss_scale)

    # The step's loops are tf.while_loop and its branches tf.cond, written out: without autograph converting its
    # functions (some forty), the first call traces in half the time. XLA needs static shapes, so a jit-compiled
    # step keeps one trace per batch shape instead of generalizing.
    if jit_compile:
        compiled = tf.function(train_step, jit_compile=True, autograph=False)
    else:
        compiled = tf.function(train_step, reduce_retracing=True, autograph=False)
    return WholeBatchStep(compiled, accumulate.observers)


def _replicated_step(
    strategy: tf.distribute.Strategy, sequence: BatchSequence, accumulate: Accumulation, measure: BatchMeasures
) -> WholeBatchStep:
    """The whole-batch step over the replicas of ``strategy``: each takes its slice of the global batch, and
    divides by the global batch's units."""
    replicas = strategy.num_replicas_in_sync

    @tf.function(reduce_retracing=True, autograph=False)
    def train_step(x: tf.Tensor, y: Targets) -> tuple[tf.Tensor, ...]:
        def replica_slice(context: tf.distribute.experimental.ValueContext) -> tuple[tf.Tensor, ...]:
            replica = context.replica_id_in_sync_group
            first_row, _ = part_bounds(replica, tf.shape(x)[0], replicas)
            return (*replica_rows((x, y), replica, replicas), first_row)

        x_parts, y_parts, first_rows = strategy.experimental_distribute_values_from_function(replica_slice)
        units = accumulate.units(y)
        loss_scale = measure.loss_scale()
        finished = sequence.run(accumulate, x_parts, y_parts, units, first_rows)
        return finished.loss_sum, units, finished.applied, measure(finished, units, units, loss_scale)

    return WholeBatchStep(train_step, accumulate.observers)
