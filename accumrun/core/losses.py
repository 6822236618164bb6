"""Per-sample losses and counts for the step: one value per sample, so sub-batches can be weighted exactly."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
"""``loss_fn(labels, logits) -> per-sample losses`` (shape ``[n]``)."""


def sparse_categorical_crossentropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-sample cross-entropy of integer labels against logits, computed in float32."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))


def correct_count(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """How many samples have their label as the largest logit (int32)."""
    predicted = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    return tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.int32))
