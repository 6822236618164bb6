"""The evaluation step: a batch's loss sum and units in inference mode, as training counts them."""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from accumrun.core.losses import LossFn, MetricSet, Objective, regularization
from accumrun.core.targets import Targets, any_rows


def make_eval_step(
    model: keras.Model, loss: Objective | LossFn, metrics: MetricSet | None = None
) -> Callable[[tf.Tensor, Targets], tuple[tf.Tensor, tf.Tensor]]:
    """Compile ``evaluate(x, y) -> (loss_sum, units)`` in inference mode (BatchNorm uses its moving statistics),
    each sample's loss times its weight when ``y`` carries weights, the regularization counted with every unit
    (sample or real token) as training counts it; it adds the samples to ``metrics``, unweighted."""
    objective = loss if isinstance(loss, Objective) else Objective(loss)

    # Its control flow is Python's, on Python values: autograph would only add tracing time.
    @tf.function(reduce_retracing=True, autograph=False)
    def eval_step(x: tf.Tensor, y: Targets) -> tuple[tf.Tensor, tf.Tensor]:
        predictions = model(x, training=False)
        if metrics is not None:
            metrics.update(y, predictions)
        loss_sum = tf.reduce_sum(objective.per_sample_loss(y, predictions))
        units = tf.reduce_sum(objective.units(y))
        if model.losses:
            # As Keras' evaluate reports it: the regularization counts in the loss of every sample.
            loss_sum += regularization(model, objective.dtype) * units
        return loss_sum, units

    def evaluate(x: tf.Tensor, y: Targets) -> tuple[tf.Tensor, tf.Tensor]:
        if not eval_step.experimental_get_tracing_count():
            # Traced first for any count of rows, so that the short last batch reuses the trace (a call dispatches to
            # a traced function whose shapes hold its own) instead of tracing again; inference runs as fast either way.
            eval_step.get_concrete_function(*any_rows((x, y)))
        return eval_step(x, y)

    return evaluate
