"""The streamed step: a batch that does not fit on the device at once, as its sub-batches, one compiled call each,
into accumulators that persist between calls, and one more call for the update."""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from accumrun.core.accumulation import Accumulation
from accumrun.core.sequence import BatchMeasures, BatchSequence
from accumrun.core.spec import BatchResult, Chunk, TrainStep
from accumrun.core.targets import Targets


class StreamedStep(TrainStep):
    """A batch that does not fit on the device at once, as its sub-batches: one compiled call each adds a
    sub-batch to accumulators that persist between calls (variables), and one more makes the batch's update and
    clears them. Each sub-batch's loss sum is divided by the whole batch's sample count, and the gradients by
    units / samples before the update (see :mod:`accumrun.core.accumulation`), so the update is the one
    :class:`~accumrun.core.step.WholeBatchStep` makes on the batch, to float rounding. Runs on one device; with
    ``jit_compile`` each sub-batch's call is compiled with XLA, once per sub-batch shape."""

    def __init__(
        self,
        sequence: BatchSequence,
        sub_batch_gradients: Accumulation,
        variables: list[tf.Variable],
        measure: BatchMeasures,
        *,
        jit_compile: bool,
    ) -> None:
        self._sequence = sequence
        self._sub_batch_gradients = sub_batch_gradients
        self._measure = measure
        self._dtype = dtype = sub_batch_gradients.dtype
        with tf.init_scope():
            self._gradients = [tf.Variable(tf.zeros(v.shape, dtype), trainable=False) for v in variables]
            self._loss_sum = tf.Variable(tf.constant(0.0, dtype), trainable=False)
            self._units = tf.Variable(tf.constant(0.0, dtype), trainable=False)
            self._observed = tf.Variable(sub_batch_gradients.observers.zeros(), trainable=False)
        self._add = tf.function(
            self._add_sub_batch, jit_compile=jit_compile or None, reduce_retracing=True, autograph=False
        )
        self._end = tf.function(self._end_batch, autograph=False)

    def train_batch(self, chunks: Iterable[Chunk], samples: int) -> BatchResult:
        """Add the sub-batches ``chunks`` of a batch of ``samples`` samples, in order, then update once.

        Raises:
            ValueError: ``chunks`` is empty.
        """
        self._sequence.start()
        metrics_before = self._sequence.open()
        total = tf.constant(samples, self._dtype)
        rows = 0
        for x, y in chunks:
            # The sub-batch's first row in the batch, for its random draws.
            self._add(x, y, total, tf.constant(rows, tf.int32))
            rows += int(x.shape[0])
        if not rows:
            raise ValueError("a streamed batch needs at least one sub-batch")
        return BatchResult(*self._end(metrics_before, total))

    def _add_sub_batch(self, x: tf.Tensor, y: Targets, total: tf.Tensor, first_row: tf.Tensor) -> tf.Tensor:
        gradients, loss_sum, observed = self._sub_batch_gradients(x, y, total, first_row)
        for accumulator, gradient in zip(self._gradients, gradients, strict=True):
            accumulator.assign_add(gradient)
        self._loss_sum.assign_add(loss_sum)
        self._observed.assign_add(observed)
        self._units.assign_add(self._sub_batch_gradients.units(y))
        return loss_sum

    def _end_batch(self, metrics_before: list[tf.Tensor], samples: tf.Tensor) -> tuple[tf.Tensor, ...]:
        units = tf.identity(self._units)
        # The sub-batches were divided by the batch's samples; the batch's mean is over its units.
        to_units = samples / units
        gradients = [g * to_units for g in self._gradients]
        loss_scale = self._measure.loss_scale()
        accumulated = self._sequence.close(
            metrics_before, gradients, tf.identity(self._loss_sum), tf.identity(self._observed)
        )
        finished = self._sequence.finish(accumulated)
        for accumulator in self._gradients:
            accumulator.assign(tf.zeros_like(accumulator))
        self._loss_sum.assign(tf.zeros_like(self._loss_sum))
        self._units.assign(tf.zeros_like(self._units))
        self._observed.assign(tf.zeros_like(self._observed))
        return finished.loss_sum, units, finished.applied, self._measure(finished, samples, units, loss_scale)
