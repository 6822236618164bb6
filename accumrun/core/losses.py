"""What the step minimises and measures: a per-sample loss, and metrics updated once per sample (or token).

Exactness needs one loss value per sample: the step weights each sub-batch by its sample count, so that uneven
sub-batches sum to the whole batch's mean. Any ``keras.losses.Loss`` built with ``reduction=None`` gives that,
and so does a custom function of ``(targets, predictions)`` that returns one value per sample.

Token-level objectives (a language model's next-token loss) count **units**, the real tokens, instead of samples:
a sample's loss is the sum over its real target tokens (those not :data:`PADDING_ID`), and it brings that many
units (:meth:`Objective.units`). The step divides by the whole batch's units, so a batch's loss is the mean over
its real tokens however they are spread over sub-batches, replicas or streamed pieces; every other objective brings
one unit per sample, which is the sample-weighted rule above. Metrics of a token-level objective count real
tokens too: padding is given a weight of 0.

Class labels are kept as integer indices on the device. A loss or metric that wants targets shaped like the
output (``categorical_crossentropy``, ``top_k_categorical_accuracy``, ``auc``, ...) gets them one-hot encoded
(or as a column of 0/1 for a model with one output unit) where it is computed. Metrics see probabilities: a model
that outputs logits has them passed through the softmax or sigmoid that its loss implies first.
This module knows nothing of the config: :mod:`accumrun.objective` builds an :class:`Objective` from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from accumrun.core.targets import Targets, unweighted, weights_of
from accumrun.core.tokens import PADDING_ID

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
"""``loss_fn(targets, predictions) -> per-sample losses`` (shape ``[n]``)."""

_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def sparse_categorical_crossentropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-sample cross-entropy of integer labels against logits, computed in float32."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))


def encode_class_labels(labels: tf.Tensor, width: int) -> tf.Tensor:
    """Class indices as targets shaped like an output of ``width`` units: one-hot rows, or for a single unit
    (binary classification with one sigmoid output) a column of 0/1."""
    if width == 1:
        return tf.cast(labels, tf.float32)[:, tf.newaxis]
    return tf.one_hot(labels, width, dtype=tf.float32)


def token_mask(labels: tf.Tensor) -> tf.Tensor:
    """1.0 where a target token is real, 0.0 where it pads (float32, shaped as ``labels``)."""
    return tf.cast(tf.not_equal(labels, PADDING_ID), tf.float32)


@dataclass(frozen=True)
class Metric:
    """One metric of a run: the name it is logged under, how to make a fresh Keras metric for it, and whether it
    takes class indices as they are (``sparse``) rather than targets shaped like the output."""

    name: str
    make: Callable[[], keras.metrics.Metric]
    sparse: bool = False


@dataclass(frozen=True)
class Objective:
    """The per-sample loss and the metrics of a run.

    Attributes:
        loss: ``(targets, predictions) -> per-sample values``; values with more axes than the batch are averaged
            over the others, as Keras does.
        class_labels: whether the targets are integer class indices.
        sparse_loss: whether the loss takes class indices as they are; if not, they are encoded to the output.
        outputs: the width of the model's output.
        to_probabilities: what turns the model's output into what the metrics see (identity, softmax, sigmoid).
        metrics: what is measured, in logging order.
        token_level: whether the targets are token ids whose real tokens (not :data:`PADDING_ID`) are the units
            that the loss and metrics count, rather than the samples.
    """

    loss: LossFn
    class_labels: bool = True
    sparse_loss: bool = True
    outputs: int = 0
    to_probabilities: Callable[[tf.Tensor], tf.Tensor] = tf.identity
    metrics: tuple[Metric, ...] = field(default_factory=tuple)
    token_level: bool = False
    dtype: tf.DType = tf.float32
    """What the losses, units, sums and metrics are computed in: float32 (mixed-precision outputs cast up), or
    float64 under ``training.precision: float64``."""

    def loss_values(self, targets: Targets, predictions: tf.Tensor) -> tf.Tensor:
        """What the loss returns for these targets (encoded as it needs them; weights left aside) and predictions
        cast to :attr:`dtype`."""
        targets = unweighted(targets)
        if self.class_labels and not self.sparse_loss:
            targets = encode_class_labels(targets, self.outputs)
        return tf.cast(self.loss(targets, tf.cast(predictions, self.dtype)), self.dtype)

    def per_sample_loss(self, targets: Targets, predictions: tf.Tensor) -> tf.Tensor:
        """The loss of each sample, in :attr:`dtype` (mixed-precision outputs included), times the sample's weight when
        the targets carry weights (see :mod:`accumrun.core.targets`). Token-level: the sum over the sample's real
        tokens; else the mean over any axes past the batch's, as Keras reduces them."""
        values = self.loss_values(targets, predictions)
        if self.token_level:
            values = tf.reduce_sum(values * tf.cast(token_mask(unweighted(targets)), self.dtype), axis=1)
        elif values.shape.rank is not None and values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        weights = weights_of(targets)
        return values if weights is None else values * tf.cast(weights, self.dtype)

    def units(self, targets: Targets) -> tf.Tensor:
        """What each sample counts for in the batch's mean (``[n]``, in :attr:`dtype`): its real tokens
        (token-level), else 1."""
        labels = unweighted(targets)
        if self.token_level:
            return tf.cast(tf.reduce_sum(token_mask(labels), axis=1), self.dtype)
        return tf.ones(tf.shape(labels)[:1], self.dtype)

    def new_metrics(self) -> MetricSet:
        """Fresh metric objects, for one kind of pass (training or validation); create them in the strategy's
        scope when there is one."""
        return MetricSet(self, [(metric, metric.make()) for metric in self.metrics])


class MetricSet:
    """Keras metric objects that accumulate over an epoch's samples, whatever the sub-batches were."""

    def __init__(self, objective: Objective, metrics: list[tuple[Metric, keras.metrics.Metric]]) -> None:
        self._objective = objective
        self._metrics = metrics

    @property
    def variables(self) -> list[tf.Variable]:
        """The metrics' state, to checkpoint and to put back when a batch's update is skipped."""
        return [variable for _, metric in self._metrics for variable in metric.variables]

    def update(self, targets: Targets, predictions: tf.Tensor) -> None:
        """Add one (sub-)batch's samples, unweighted (as Keras' ``metrics=``, not its ``weighted_metrics=``)."""
        if not self._metrics:
            return
        targets = unweighted(targets)
        objective = self._objective
        probabilities = objective.to_probabilities(tf.cast(predictions, objective.dtype))
        # Encoded once, and only for a metric that needs it (a language model's one-hot targets would be large).
        encoded = (
            encode_class_labels(targets, objective.outputs)
            if objective.class_labels and not all(spec.sparse for spec, _ in self._metrics)
            else targets
        )
        # Token-level: each real token counts once, padding not at all.
        mask = token_mask(targets) if objective.token_level else None
        for spec, metric in self._metrics:
            metric.update_state(targets if spec.sparse else encoded, probabilities, sample_weight=mask)

    def reset(self) -> None:
        """Start a new epoch."""
        for _, metric in self._metrics:
            metric.reset_state()

    @property
    def names(self) -> list[str]:
        """The metrics' logged names, in order."""
        return [spec.name for spec, _ in self._metrics]

    def result_tensor(self) -> tf.Tensor:
        """Every metric's value as one float64 vector (which holds a float32 metric exactly), in the order of
        :attr:`names`, for use in a compiled call."""
        if not self._metrics:
            return tf.zeros([0], tf.float64)
        return tf.stack([tf.cast(metric.result(), tf.float64) for _, metric in self._metrics])

    def results(self) -> dict[str, float]:
        """Each metric's value over the samples added since the last reset, by its logged name."""
        return {spec.name: float(keras.ops.convert_to_numpy(metric.result())) for spec, metric in self._metrics}


class Perplexity(keras.metrics.Metric):
    """``exp`` of the mean cross-entropy over the real tokens (or samples) seen since the last reset: each target's
    negative log-probability, weighted by ``sample_weight`` (the token mask). It takes probabilities, as every
    metric here does; a probability below float32's smallest normal number counts as that number."""

    def __init__(self, name: str = "perplexity", **keywords: object) -> None:
        super().__init__(name=name, **keywords)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true: tf.Tensor, y_pred: tf.Tensor, sample_weight: tf.Tensor | None = None) -> None:
        labels = tf.cast(y_true, tf.int32)
        chosen = tf.gather(tf.cast(y_pred, tf.float32), labels, batch_dims=labels.shape.rank)
        negative_log = -tf.math.log(tf.maximum(chosen, _SMALLEST_NORMAL))
        weights = tf.ones_like(negative_log) if sample_weight is None else tf.cast(sample_weight, tf.float32)
        self.total.assign_add(tf.reduce_sum(negative_log * weights))
        self.count.assign_add(tf.reduce_sum(weights))

    def result(self) -> tf.Tensor:
        return tf.exp(tf.math.divide_no_nan(self.total, self.count))


def regularization(model: keras.Model, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """The sum of ``model``'s regularization losses, as ``dtype``."""
    return tf.cast(tf.add_n(model.losses), dtype)
