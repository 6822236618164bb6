"""Targets with per-sample weights: one structure that every cut of a batch slices as one.

A run with sample weights (``data.weight``, or ``training.class_weight`` turned into one weight per training
sample) hands the step :class:`Weighted` targets instead of a bare tensor. Everything that cuts a batch (the
resident gather, ``tf.data``'s batching, the replicas' slices, the sub-batches) maps its cut over the structure
with ``tf.nest``, so the weights always stay with their samples' targets; there is one mechanism, not one per feed.
The loss multiplies each sample's loss by its weight (:meth:`accumrun.core.losses.Objective.per_sample_loss`) and
the metrics take the targets alone (:func:`unweighted`). A run without weights passes bare tensors, as before:
nothing is added to its step.

The reduction is Keras' ``sum_over_batch_size``: a batch's loss is ``sum_i(w_i * l_i) / n``, over its ``n``
samples, not over the sum of the weights. The step already divides the sub-batches' sums by the batch's sample
count, so weighted sub-batches accumulate to the weighted batch exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf


class Weighted(NamedTuple):
    """Targets and one float32 weight per sample, sliced together."""

    targets: tf.Tensor
    weights: tf.Tensor


Targets = Any
"""A bare target tensor, or :class:`Weighted` targets (a ``tf.nest`` structure either way)."""


def unweighted(targets: Targets) -> tf.Tensor:
    """The targets without their weights (the metrics are unweighted, as Keras' ``metrics=`` are)."""
    return targets.targets if isinstance(targets, Weighted) else targets


def weights_of(targets: Targets) -> tf.Tensor | None:
    """The per-sample weights the targets carry, or None."""
    return targets.weights if isinstance(targets, Weighted) else None


def each(fn: Callable[[tf.Tensor], tf.Tensor], targets: Targets) -> Targets:
    """``fn`` (a slice, a gather) applied to the targets and their weights alike."""
    return tf.nest.map_structure(fn, targets)


def any_rows(batch: Any) -> Any:
    """The ``tf.TensorSpec`` of every tensor in ``batch`` (a structure: inputs, targets and their weights) with any
    count of rows: a function traced for it serves every batch size."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), batch)


def as_targets(y: np.ndarray | tf.Tensor, w: np.ndarray | tf.Tensor | None) -> Targets:
    """``y`` as tensor targets, :class:`Weighted` by ``w`` (as float32) when there are weights."""
    if w is None:
        return tf.convert_to_tensor(y)
    return Weighted(tf.convert_to_tensor(y), tf.cast(tf.convert_to_tensor(w), tf.float32))
