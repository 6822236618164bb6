"""The gradient noise scale of McCandlish et al., "An Empirical Model of Large-Batch Training" (2018), from what
accumulation has in hand: each sub-batch's gradient and the batch's.

Sub-batch ``j`` of ``b_j`` units (samples, or real target tokens) has its own mean gradient ``g_j``; the batch of
``B = sum_j b_j`` units has ``G_B``, and ``P`` sub-batches over every replica. Then, unbiased for any sizes where
the units are drawn independently (samples; a language model's tokens, drawn a window at a time, are not)::

    tr(S) = (sum_j b_j |g_j|^2 - B |G_B|^2) / (P - 1)        |G|^2 = |G_B|^2 - tr(S) / B

which for equal sub-batches are McCandlish et al.'s two-batch-size estimators (their appendix A). The step adds
``|d_j|^2 / b_j`` for each sub-batch's accumulated share ``d_j = g_j b_j / D`` (``D`` being what it divided the
sub-batch's loss sum by), so that ``sum_j b_j |g_j|^2 = D^2 sum_j |d_j|^2 / b_j``; :func:`estimates` finishes.
:class:`GradientNoise` is the step's observer of it (:mod:`accumrun.core.observers`).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from accumrun.core.observers import BatchScale, Observer

MEASURES = 3
"""The width of a batch's estimates: ``[|G|^2, tr(S), valid]`` (valid is 1.0 with two sub-batches or more)."""


class GradientNoise(Observer):
    """The batch's ``[|G|^2, tr(S), valid]`` (:func:`estimates`): each sub-batch adds its :func:`sub_batch_part`,
    and the batch takes the squared norm of its gradient summed over the replicas, before the update. It needs two
    parts: with one sub-batch on one device there is no second batch size to compare with.

    With ``every`` above 1 it measures only the updates whose index (``updates``, the optimizer's step counter,
    which a checkpoint restores) ``every`` divides; the others add nothing, cost a branch per sub-batch, and give
    ``valid`` 0."""

    name = "noise_scale"
    state_width = 2
    width = MEASURES
    least_parts = 2

    def __init__(self, every: int = 1, updates: tf.Variable | None = None) -> None:
        if every > 1 and updates is None:
            raise ValueError("measuring one update in every few needs the update counter")
        self._every = every
        self._updates = updates

    def _measured(self) -> tf.Tensor | None:
        """Whether this update is measured (None: every update is, with no branch at all)."""
        if self._every == 1 or self._updates is None:
            return None
        return tf.equal(tf.math.floormod(tf.cast(self._updates, tf.int64), self._every), 0)

    def sub_batch(self, gradients: list[tf.Tensor | None], units: tf.Tensor) -> tf.Tensor:
        measured = self._measured()
        if measured is None:
            return sub_batch_part(gradients, units)
        return tf.cond(measured, lambda: sub_batch_part(gradients, units), lambda: tf.zeros([2], tf.float32))

    def batch(self, state: tf.Tensor, gradient: Callable[[], list[tf.Tensor]]) -> tuple[tf.Tensor, tf.Tensor]:
        measured = self._measured()
        if measured is None:
            return state, squared_norm(gradient())
        # The replicas' sum is taken outside the branch: a collective runs on every replica or on none.
        summed = gradient()
        return state, tf.cond(measured, lambda: squared_norm(summed), lambda: tf.constant(0.0, tf.float64))

    def result(self, batch: tuple[tf.Tensor, tf.Tensor], scale: BatchScale) -> tf.Tensor:
        parts, batch_sq_norm = batch
        return estimates(parts, batch_sq_norm, *scale)


def sub_batch_part(gradients: list[tf.Tensor | None], units: tf.Tensor) -> tf.Tensor:
    """``[|d|^2 / b, 1]`` (float32) for a sub-batch of ``units`` units whose share of the batch's gradient is
    ``gradients`` (``[0, 0]`` for an empty sub-batch, which is not one of the ``P``). This runs for every sub-batch,
    where tiny sub-batches leave little to hide it behind, so it is a few ops: one fused square-and-sum per
    variable (``l2_loss``, half the sum), in the gradient's own precision."""
    units = tf.cast(units, tf.float32)
    half_squared = tf.add_n([tf.cast(tf.nn.l2_loss(g), tf.float32) for g in gradients if g is not None])
    return tf.stack([2.0 * tf.math.divide_no_nan(half_squared, units), tf.minimum(units, 1.0)])


def squared_norm(gradients: list[tf.Tensor]) -> tf.Tensor:
    """``|G|^2`` (float64) of a gradient given as one tensor per variable, once per batch. (The sub-batches' norms
    are float32, summed over at most the batch's sub-batches; the difference :func:`estimates` takes is float64.)"""
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64))) for g in gradients])


def estimates(
    parts: tf.Tensor, batch_sq_norm: tf.Tensor, divided_by: tf.Tensor, units: tf.Tensor, loss_scale: tf.Tensor
) -> tf.Tensor:
    """``[|G|^2, tr(S), valid]`` (float64) for one batch, from the sum of its sub-batches' :func:`sub_batch_part`
    over every replica (``parts``), the squared norm of its accumulated gradient, what each sub-batch's loss sum was
    divided by, the batch's units, and the loss scale that multiplied the gradients (1 without one)."""
    parts, divided_by, units, loss_scale = (tf.cast(v, tf.float64) for v in (parts, divided_by, units, loss_scale))
    sub_batch_sq, count = parts[0], parts[1]
    unscale = 1.0 / tf.square(loss_scale)
    weighted = tf.square(divided_by) * sub_batch_sq * unscale
    batch = batch_sq_norm * unscale
    # With one sub-batch there is no second batch size: the batch says nothing about the noise.
    valid = count >= 2.0
    trace = tf.math.divide_no_nan(weighted - units * batch, count - 1.0)
    sq_norm = batch - tf.math.divide_no_nan(trace, units)
    return tf.where(valid, tf.stack([sq_norm, trace, tf.constant(1.0, tf.float64)]), tf.zeros([MEASURES], tf.float64))
