"""Accumulation: a batch's gradient as the sum of its sub-batches', each one forward and backward pass.

The rule: a batch of ``n`` samples is cut into ``s = min(subdivisions, n)`` sub-batches
(see :mod:`accumrun.core.sub_batches`). Each sub-batch runs forward and backward on the *sum* of its per-sample
losses divided by ``n``, the whole batch's sample count. Summing those gradients over the sub-batches therefore gives
exactly the gradient of the batch's mean loss, however unevenly the batch splits: it is the sample-weighted mean of the
sub-batch mean gradients. Recipes that average the ``s`` sub-batch means (divide by ``s``) are wrong whenever
the sub-batches differ in size.

All sub-batches of a batch run inside one ``tf.while_loop`` (one, or one per sub-batch size when the batch's shape
is static), slicing the batch where it already lives, on the device. Only one sub-batch's activations are alive at a
time; the extra memory is one accumulator per trainable variable. Each sub-batch also adds its part to the state of
the step's observers (:mod:`accumrun.core.observers`), inside the same loop.

Units: samples or tokens. Everything above divides by the batch's **units**, which are its samples for every
sample-level objective. A token-level objective (a language model's) counts the real target tokens instead
(:meth:`~accumrun.core.losses.Objective.units`): each sub-batch's sum over its real tokens is divided by the real
tokens of the whole batch (on every replica, of the global batch), so padding and the split never change the update.
A streamed batch cannot count its tokens before its last sub-batch arrives: it divides by the batch's sample count
as its sub-batches come, counts their units, and rescales the gradients by samples / units once, before the update
(a factor of exactly 1 for a sample-level objective).

Bucketed padding. With ``bucket``, each sub-batch of token ids is cut, on the device, to its longest real sequence
rounded up to a multiple of ``bucket`` (:func:`trim_padding`): the positions cut are padding in every row, which a
model that masks padding never looks at, so the update is the same and a sub-batch of short texts costs less. The
sub-batch's length is a tensor inside the loop, so the step still traces once.

Sample weights. Targets may carry one weight per sample (:class:`~accumrun.core.targets.Weighted`); each
sample's loss is then multiplied by its weight before the sums above, so a batch's objective is
``sum_i(w_i * l_i) / n`` (Keras' ``sum_over_batch_size``), and the split, the replicas' slices and the streamed
sub-batches stay exact as they are. Metrics are unweighted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import LossFn, Objective, regularization
from accumrun.core.observers import Observers
from accumrun.core.spec import StepSpec, step_spec
from accumrun.core.sub_batches import SubBatchLoop, sub_batch_loops
from accumrun.core.targets import Targets, each
from accumrun.core.tokens import PADDING_ID
from accumrun.kinds import BatchNormMode

Totals = tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]
"""``(gradients, loss_sum, observed)`` accumulated so far; ``observed`` is the sum of the sub-batches' additions to
the observers' state (:meth:`~accumrun.core.observers.Observers.sub_batch`), empty without observers."""

# How many sub-batches the loop may run at once (TensorFlow's default is 10). More is faster on tiny sub-batches
# but holds that many sub-batches' activations; benchmarks/step_speed.py --parallel measures it.
PARALLEL_SUB_BATCHES = 1


class Accumulation:
    """The gradient function of :func:`make_gradient_fn`: the sub-batches of ``spec`` (its subdivisions, metrics,
    BatchNorm statistics, draws, bucket and XLA), each sub-batch's objective multiplied by ``scale_loss``."""

    def __init__(
        self,
        model: keras.Model,
        objective: Objective,
        spec: StepSpec,
        scale_loss: Callable[[tf.Tensor], tf.Tensor] | None = None,
    ) -> None:
        self._model = model
        self._bucket = spec.bucket
        self._objective = objective
        self.dtype = objective.dtype
        """What the gradients and the loss are summed in: float32 whatever the compute dtype, or float64."""
        self._subdivisions = spec.subdivisions
        self._scale_loss = scale_loss
        self._metrics = spec.metrics
        self._batch_norm = (
            spec.batch_norm if spec.batch_norm is not None else BatchNormStatistics(model, BatchNormMode.SUB_BATCH)
        )
        self._draws = spec.draws
        self.observers = Observers(spec.observers)
        """What each sub-batch adds to (:mod:`accumrun.core.observers`)."""
        self._training = not spec.inference_mode
        self._variables = model.trainable_variables
        # With XLA, each sub-batch of unknown shape is one cluster, compiled once per sub-batch shape.
        self._clustered = tf.function(self.add, jit_compile=True, reduce_retracing=True) if spec.jit_compile else None

    def units(self, y: Targets) -> tf.Tensor:
        """The units of the batch ``y`` holds (in :attr:`dtype`): its samples, or its real tokens."""
        return tf.reduce_sum(self._objective.units(y))

    def __call__(self, x: tf.Tensor, y: Targets, total: tf.Tensor | None = None, first_row: Any = 0) -> Totals:
        totals: Totals = (
            [tf.zeros_like(v, dtype=self.dtype) for v in self._variables],
            tf.constant(0.0, self.dtype),
            self.observers.zeros(),
        )
        n_float = tf.cast(self.units(y) if total is None else total, self.dtype)
        for loop in sub_batch_loops(x, y, self._subdivisions):
            add = self._clustered if self._clustered is not None and not loop.static else self.add
            totals = self._sum(loop, add, n_float, totals, first_row)
        return totals

    def _sum(
        self, loop: SubBatchLoop, add: Callable[..., Totals], n_float: tf.Tensor, totals: Totals, offset: Any
    ) -> Totals:
        """Add the sub-batches of ``loop`` to ``totals`` in a ``tf.while_loop``, so there is no Python round-trip per
        sub-batch."""

        def body(k: tf.Tensor, gradients: list[tf.Tensor], loss_sum: tf.Tensor, observed: tf.Tensor) -> tuple[Any, ...]:
            x_sub, y_sub, first_row = loop.take(loop.indices[k])
            gradients, sub_loss_sum, sub_observed = add(x_sub, y_sub, offset + first_row, n_float, gradients)
            return k + 1, gradients, loss_sum + sub_loss_sum, observed + sub_observed

        count = tf.shape(loop.indices)[0]
        _, gradients, loss_sum, observed = tf.while_loop(
            lambda k, *_: k < count,
            body,
            (tf.constant(0), *totals),
            # One iteration at a time: by default the loop may overlap up to 10 sub-batches, and with them their
            # activations, which is the memory that subdivisions exist to save.
            parallel_iterations=PARALLEL_SUB_BATCHES,
        )
        return gradients, loss_sum, observed

    def add(
        self, x_sub: tf.Tensor, y_sub: Targets, first_row: tf.Tensor, n_float: tf.Tensor, gradients: list[tf.Tensor]
    ) -> Totals:
        """One sub-batch forward and backward: ``gradients`` plus its share of the batch's, its loss sum, and its
        addition to the observers' state."""
        if self._bucket is not None:
            x_sub, y_sub = trim_padding(x_sub, y_sub, self._bucket, token_targets=self._objective.token_level)
        draws = self._draws.sub_batch(first_row, tf.shape(x_sub)[0]) if self._draws else contextlib.nullcontext()
        with tf.GradientTape() as tape:
            # Runs while the step is traced: the BatchNorm layers are traced as the mode says, and the random ones
            # draw for these rows of the batch.
            with self._batch_norm.tracing(), draws:
                predictions = self._model(x_sub, training=self._training)
            sub_loss_sum = tf.reduce_sum(self._objective.per_sample_loss(y_sub, predictions))
            if self._model.losses:
                # Regularization belongs to the batch once; each sub-batch carries its units' share of it, and of
                # the logged loss, which is what is minimized (as Keras fit logs it).
                sub_loss_sum += regularization(self._model, self.dtype) * self.units(y_sub)
            batch_share = sub_loss_sum / n_float
            if self._scale_loss is not None:
                batch_share = self._scale_loss(batch_share)
        # A variable the loss does not reach (an unused pooler) gets None: its accumulator stays as it is. (TF's
        # UnconnectedGradients.ZERO fails on Keras variables, whose dtype is a string.)
        sub_gradients = tape.gradient(batch_share, self._variables)
        if self._metrics is not None:
            self._metrics.update(y_sub, predictions)
        self._batch_norm.record(tf.shape(x_sub)[0])
        observed = self.observers.sub_batch(sub_gradients, lambda: self.units(y_sub))
        gradients = [
            g if d is None else g + tf.cast(tf.convert_to_tensor(d), self.dtype)
            for g, d in zip(gradients, sub_gradients, strict=True)
        ]
        return gradients, sub_loss_sum, observed


def make_gradient_fn(
    model: keras.Model,
    loss: Objective | LossFn,
    spec: StepSpec | int,
    *,
    scale_loss: Callable[[tf.Tensor], tf.Tensor] | None = None,
    **fields: Any,
) -> Accumulation:
    """A function ``(x, y, total=None, first_row=0) -> (gradients, loss_sum, observed)`` that accumulates over
    the sub-batches, and whose ``units(y)`` counts a batch's units (samples, or real tokens).

    ``gradients`` is the gradient of the batch's mean loss per unit (plus the model's regularization losses) with
    respect to ``model.trainable_variables``; ``loss_sum`` is the sum of the per-sample losses, each unit with the
    regularization added (so ``loss_sum / units`` is the objective minimized, as Keras ``fit`` logs its loss);
    ``observed`` the sub-batches' additions to the state of ``spec.observers`` (:mod:`accumrun.core.observers`).
    ``spec.metrics``, when given, are updated with every sub-batch's samples. ``total`` is the unit count that the
    losses are divided by, ``y``'s own by default; a replica that holds one slice of a batch passes the whole
    batch's, so that the replicas' gradients sum to the batch's (see :mod:`accumrun.core.sequence`); an empty slice then
    gives zero gradients.
    ``first_row`` is where ``x`` starts in the global batch (a streamed sub-batch, a replica's slice). It is not
    compiled by itself: call it inside a ``tf.function`` (as the steps do) or eagerly in tests.

    ``spec`` is a :class:`StepSpec` or a subdivision count, ``fields`` any of its fields replaced (see
    :func:`step_spec`); the strategy and the feed are the step's, not used here. The batch is cut by
    :func:`accumrun.core.sub_batches.sub_batch_loops`: one loop per sub-batch size when the batch's
    size is known at tracing (full batches, and every batch of a step compiled whole by XLA), else one loop that
    cuts by index; the sum is the same, in another order. With ``spec.jit_compile``, each sub-batch of that one loop
    (forward pass, backward pass and accumulation) is one XLA cluster. ``scale_loss`` (a loss-scale
    optimizer's) multiplies each sub-batch's objective, so float16 gradients do not underflow; the gradients
    returned are then scaled by it too, and are accumulated in float32 whatever the compute dtype (in float64 where the
    objective's dtype is, ``training.precision: float64``).
    ``spec.batch_norm`` sets what the BatchNorm layers do in the forward passes, and records each sub-batch's moments
    for a per-batch update of their moving statistics (see :mod:`accumrun.core.batch_norm`); without it, Keras'
    own behaviour holds (``sub_batch``). ``spec.draws`` has the random layers (dropout) draw per sample, by their row
    in the batch (see :mod:`accumrun.core.seeds`). ``spec.bucket`` cuts each sub-batch of token ids to its longest real
    sequence, rounded up to a multiple of it (see the module's docstring).
    """
    objective = loss if isinstance(loss, Objective) else Objective(loss)
    return Accumulation(model, objective, step_spec(spec, **fields), scale_loss)


def trim_padding(x: tf.Tensor, y: Targets, bucket: int, *, token_targets: bool) -> tuple[tf.Tensor, Targets]:
    """Token ids ``x`` (and, for ``token_targets``, the targets of each position) cut to the longest real sequence
    (its last id that is not :data:`~accumrun.core.losses.PADDING_ID`) rounded up to a multiple of ``bucket``, at
    most their length and at least one position."""
    length = tf.shape(x)[1]
    ends = tf.where(tf.not_equal(x, PADDING_ID), tf.range(1, length + 1)[tf.newaxis, :], 0)
    longest = tf.reduce_max(ends)
    kept = tf.clip_by_value((longest + bucket - 1) // bucket * bucket, 1, length)
    if token_targets:
        # Per-sample weights (one per row) are not cut.
        y = each(lambda t: t[:, :kept] if t.shape.rank == 2 else t, y)
    return x[:, :kept], y
