"""Several updates in one compiled call, over data already on the device, or over the call's own batches.

Each update is one batch through the whole-batch step (see :mod:`accumrun.core.step`): the rows of the batch are
gathered from the data on the device (held for the run), or from the call's batches, read for it (a source read as
it is needed: the disk cache), and the step makes the batch's one update, exactly as a call of its own would. A
``tf.while_loop`` runs the updates one after another, so the host is needed once per call, not once per update:
what a cheap update (full-batch gradient descent on a small model) otherwise spends on dispatch, on iterators and
on Python.

A call may cross the end of an epoch. The training metrics count an epoch's samples, so they are reset where an
epoch starts, and their values are read where one ends, inside the call; what else an epoch's end needs
(validation, checkpoints, the controls) ends the call there, which is the caller's choice (see
:mod:`accumrun.training.cadence`). Every batch of one call has the same size, so the step sees the static shape it
sees in a call of its own, and the results are those of one update per call, bit for bit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from accumrun.core.losses import MetricSet
from accumrun.core.step import WholeBatchStep
from accumrun.core.targets import Targets, any_rows, each


class Updates(NamedTuple):
    """What one call returns, one row per update it ran (it stops early after an update that
    ``stop_on_nonfinite`` stops at)."""

    loss_sums: np.ndarray
    """Each update's batch loss sum."""
    units: np.ndarray
    """What each loss sum is a sum over: the batch's samples, or its real tokens."""
    applied: np.ndarray
    """Whether each update was applied (false: skipped, a NaN or Inf, or a loss-scale overflow)."""
    learning_rates: np.ndarray
    """The learning rate after each update, as the optimizer reports it (a schedule's, at its new step)."""
    optimizer_steps: np.ndarray
    """The optimizer's update count after each update."""
    metrics: np.ndarray
    """After an update that ends an epoch, the training metrics' values over that epoch; zeros elsewhere."""
    measures: np.ndarray
    """Each update's batch measures (:attr:`accumrun.core.spec.BatchResult.measures`), one row each."""


class UpdateLoop:
    """Runs ``step`` on batches gathered from ``x`` and ``y`` (tensors on the device; ``y`` may carry per-sample
    weights, gathered with it), several per call; with ``x`` None, from the data each call is given.

    ``metrics`` are the training metrics the step updates. ``stop_on_nonfinite`` ends a call at the first update
    that was not applied because its loss or gradient was NaN or Inf (a loss-scale overflow with a finite loss is
    routine, and does not end it), so that nothing trains past a divergence the caller will stop at.
    """

    def __init__(
        self,
        step: WholeBatchStep,
        x: tf.Tensor | None,
        y: Targets | None,
        *,
        optimizer: keras.optimizers.Optimizer,
        metrics: MetricSet,
        stop_on_nonfinite: bool,
    ) -> None:
        self._step = step
        self._x, self._y = x, y
        self._optimizer = optimizer
        self._metrics = metrics
        self._stop_on_nonfinite = stop_on_nonfinite
        self._loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        # One compiled call per batch size: the batch's size is static inside, as it is for a call of its own.
        self._calls: dict[int, tf.types.experimental.GenericFunction] = {}

    def __call__(
        self,
        rows: np.ndarray,
        starts_epoch: np.ndarray,
        ends_epoch: np.ndarray,
        data: tuple[tf.Tensor, Targets] | None = None,
    ) -> Updates:
        """Run one update per row of ``rows`` (``[updates, batch_size]`` row indices into the data, in the order
        the batch takes them). ``starts_epoch`` and ``ends_epoch`` flag the updates that begin or end an epoch:
        the metrics are reset before the first and read after the second. ``data`` is the call's ``(x, y)`` where
        the loop holds none."""
        given = () if data is None else data
        batch_size = int(rows.shape[1])
        if batch_size not in self._calls:
            # The data's spec, with any count of rows: one trace serves calls of any length.
            specs = any_rows(tuple(given))
            self._calls[batch_size] = tf.function(
                self._run,
                # Written with tf.while_loop and tf.cond: nothing for autograph to convert, which saves tracing time.
                autograph=False,
                input_signature=[
                    tf.TensorSpec([None, batch_size], tf.int32),
                    tf.TensorSpec([None], tf.bool),
                    tf.TensorSpec([None], tf.bool),
                    *specs,
                ],
            )
        outputs = self._calls[batch_size](
            tf.constant(rows, tf.int32), tf.constant(starts_epoch, tf.bool), tf.constant(ends_epoch, tf.bool), *given
        )
        return Updates(*(output.numpy() for output in outputs))

    @property
    def traces(self) -> int:
        """How many times the calls were traced so far (a traced call's time is not the work's)."""
        return sum(call.experimental_get_tracing_count() for call in self._calls.values())

    def _run(
        self, rows: tf.Tensor, starts_epoch: tf.Tensor, ends_epoch: tf.Tensor, *data: Any
    ) -> tuple[tf.Tensor, ...]:
        x, y = data if data else (self._x, self._y)
        count = tf.shape(rows)[0]
        metric_count = len(self._metrics.names)
        # Sized as they fill: a call that stops early returns only the updates it ran.
        outputs = (
            # float64, which holds a float32 sum exactly and a float64 one (training.precision: float64) whole.
            tf.TensorArray(tf.float64, size=0, dynamic_size=True),
            tf.TensorArray(tf.float64, size=0, dynamic_size=True),
            tf.TensorArray(tf.bool, size=0, dynamic_size=True),
            tf.TensorArray(tf.float32, size=0, dynamic_size=True),
            tf.TensorArray(tf.int64, size=0, dynamic_size=True),
            tf.TensorArray(tf.float64, size=0, dynamic_size=True, element_shape=[metric_count]),
            tf.TensorArray(tf.float64, size=0, dynamic_size=True, element_shape=[self._step.observers.width]),
        )

        def reset() -> tf.Tensor:
            self._metrics.reset()
            return tf.constant(True)

        def update(k: tf.Tensor, stopped: tf.Tensor, arrays: tuple[tf.TensorArray, ...]) -> tuple[Any, ...]:
            reset_done = tf.cond(starts_epoch[k], reset, lambda: tf.constant(False))
            with tf.control_dependencies([reset_done]):
                batch = tf.identity(rows[k])
            targets = each(lambda t: tf.gather(t, batch), y)
            loss_sum, units, applied, measures = self._step(tf.gather(x, batch), targets)
            with tf.control_dependencies([loss_sum, applied]):
                metrics = tf.cond(
                    ends_epoch[k], self._metrics.result_tensor, lambda: tf.zeros([metric_count], tf.float64)
                )
                rate = tf.cast(self._optimizer.learning_rate, tf.float32)
                steps = tf.cast(self._optimizer.iterations, tf.int64)
            values = (
                tf.cast(loss_sum, tf.float64),
                tf.cast(units, tf.float64),
                applied,
                rate,
                steps,
                metrics,
                measures,
            )
            arrays = tuple(array.write(k, value) for array, value in zip(arrays, values, strict=True))
            stop = (
                tf.logical_and(tf.logical_not(applied), self._diverged(loss_sum))
                if self._stop_on_nonfinite
                else stopped
            )
            return k + 1, stop, arrays

        # One update at a time: each reads the weights the one before it wrote.
        _, _, arrays = tf.while_loop(
            lambda k, stopped, _: tf.logical_and(k < count, tf.logical_not(stopped)),
            update,
            (tf.constant(0), tf.constant(False), outputs),
            parallel_iterations=1,
        )
        return tuple(array.stack() for array in arrays)

    def _diverged(self, loss_sum: tf.Tensor) -> tf.Tensor:
        """Whether an update that was not applied stops training: always, but for a loss-scale optimizer's
        overflow, which has a finite loss."""
        if self._loss_scaled:
            return tf.logical_not(tf.math.is_finite(loss_sum))
        return tf.constant(True)
