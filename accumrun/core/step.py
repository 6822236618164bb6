"""The accumulation step: one optimizer update per batch, however the batch arrives.

The rule: a batch of ``n`` samples is cut into ``s = min(subdivisions, n)`` sub-batches (see
:mod:`accumrun.core.split`). Each sub-batch runs forward and backward on the *sum* of its per-sample losses divided
by ``n``, the whole batch's sample count. Summing those gradients over the sub-batches therefore gives exactly
the gradient of the batch's mean loss, however unevenly the batch splits: it is the sample-weighted mean of the
sub-batch mean gradients. Recipes that average the ``s`` sub-batch means (divide by ``s``) are wrong whenever
the sub-batches differ in size.

In a :class:`WholeBatchStep`, all sub-batches run inside one ``tf.function`` (``tf.while_loop`` loops:
one, or one per sub-batch size when the batch's shape is static), slicing the batch where it already lives, on the
device. Only one sub-batch's activations are alive at a time; the extra memory is one accumulator per trainable
variable.

Across replicas (``tf.distribute``), every worker holds the same global batch of ``n`` samples (the data order
depends on the seed and the epoch alone). Replica ``r`` of ``R`` takes the contiguous slice
``[r*n//R, (r+1)*n//R)`` (see :mod:`accumrun.core.split`) and accumulates its sub-batches as on one device,
except that each sub-batch's loss sum is divided by ``n``, the *global* sample count. Summed over the replicas,
those local gradients are exactly the gradient of the batch's mean loss: the single-device update, for uneven
slices, the short last batch and empty slices too.

Where the replicas' sums happen. Called in a replica context, Keras' ``optimizer.apply_gradients`` all-reduces
(sums) the gradients itself (``_all_reduce_sum_gradients`` in ``keras/src/backend/tensorflow/optimizer.py``),
then updates every replica's copy of the variables identically. That is the batch's one gradient reduction,
after the sub-batch loop; this module sums gradients across replicas itself only to measure the noise scale (see
below), and never passes a summed gradient on, so the update sums them exactly once. Before it, one small
all-reduce of two numbers carries the loss sum and how many replicas saw a NaN or Inf, so that every replica takes
the same decision to apply the update or skip it: a replica that skipped alone would leave the others waiting in
the gradient all-reduce. That decision and the
update run in the cross-replica context, because ``tf.distribute`` forbids a ``tf.cond`` in a replica context
around the synchronization that ``apply_gradients`` does (Keras' ``LossScaleOptimizer`` takes the same route).

How the pieces fit. :class:`BatchSequence` is what happens around every batch's accumulation, written once. Two
steps run it, behind one interface, :meth:`TrainStep.train_batch`: :class:`WholeBatchStep` runs a whole batch in
one compiled call, on one device or on the replicas of a strategy; :class:`StreamedStep` takes a batch that does
not fit on the device as its sub-batches, one compiled call each, into accumulators that persist between calls,
and makes the update in one more call. :func:`make_train_step` builds either.

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

The noise scale. With ``spec.noise_scale``, each sub-batch also adds the squared norm of its share of the
gradient over its units, and the batch's sequence takes the squared norm of the batch's gradient before the update
(with replicas, after one more all-reduce, of the gradients; the sub-batches' two numbers join the loss sum's
all-reduce); from those the step returns the batch's estimates of ``|G|^2`` and ``tr(S)`` beside its loss
(:mod:`accumrun.core.noise`). Without it the step computes none of this.

This module knows nothing of configs, files or the command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from accumrun.core.batch_norm import BatchNormStatistics, Moments
from accumrun.core.losses import LossFn, MetricSet, Objective, regularization
from accumrun.core.noise import MEASURES, estimates, squared_norm, sub_batch_part
from accumrun.core.seeds import LayerDraws
from accumrun.core.split import SubBatchLoop, part_bounds, replica_rows, sub_batch_loops
from accumrun.core.targets import Targets, each
from accumrun.core.tokens import PADDING_ID
from accumrun.kinds import BatchNormMode, Feed

Chunk = tuple[tf.Tensor, Targets]
"""``(x, y)``: a whole batch, or one of its sub-batches; ``y`` may carry per-sample weights
(:mod:`accumrun.core.targets`), which every cut below slices with the targets."""

Totals = tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]
"""``(gradients, loss_sum, noise_parts)`` accumulated so far; ``noise_parts`` is the sum of the sub-batches'
:func:`~accumrun.core.noise.sub_batch_part` with ``spec.noise_scale``, else zeros."""


class BatchResult(NamedTuple):
    """What a train step returns for one batch."""

    loss_sum: tf.Tensor
    """The sum of the batch's per-sample (or per-token) losses, regularization included."""
    units: tf.Tensor
    """What the loss sum is divided by: the batch's samples, or its real tokens (token-level objectives)."""
    applied: tf.Tensor
    """Whether the update was applied (false: skipped, a NaN or Inf, or a loss-scale overflow)."""
    measures: tf.Tensor
    """With ``spec.noise_scale``, the batch's ``[|G|^2, tr(S), valid]`` (:func:`accumrun.core.noise.estimates`);
    else empty."""


# How many sub-batches the loop may run at once (TensorFlow's default is 10). More is faster on tiny sub-batches
# but holds that many sub-batches' activations; benchmarks/step_speed.py --parallel measures it.
PARALLEL_SUB_BATCHES = 1


@dataclass(frozen=True, kw_only=True)
class StepSpec:
    """The options of a train step, one value built once and passed whole (see :func:`make_train_step`). New
    behaviour arrives as a field here, never as a second factory."""

    subdivisions: int = 1
    """How many sub-batches a whole batch is cut into (a streamed batch arrives already cut)."""
    feed: Feed = Feed.BATCH
    """How batches arrive: whole (one compiled call per batch), or as their sub-batches (one call each)."""
    metrics: MetricSet | None = None
    """The training metrics, updated with every sub-batch's samples (from ``objective.new_metrics()``)."""
    batch_norm: BatchNormStatistics | None = None
    """The BatchNorm mode and statistics (created in the strategy's scope); None is Keras' own, ``sub_batch``."""
    draws: LayerDraws | None = None
    """Per-sample draws of the random layers (dropout), by the update and the sample's row in the batch."""
    bucket: int | None = None
    """Cut each sub-batch of token ids to its longest sequence, rounded up to a multiple of this."""
    jit_compile: bool = False
    """Compile with XLA."""
    noise_scale: bool = False
    """Estimate each batch's gradient noise from its sub-batches (:mod:`accumrun.core.noise`)."""
    inference_mode: bool = False
    """Call the model in inference mode: dropout and noise draw nothing and BatchNorm normalizes with its moving
    statistics, so the objective is a function of the weights alone (L-BFGS's line search needs that)."""
    strategy: tf.distribute.Strategy | None = None
    """Deal each global batch out to the replicas of this strategy (the model, optimizer and metrics created in
    its scope)."""

    @property
    def measure_width(self) -> int:
        """The width of :attr:`BatchResult.measures`."""
        return MEASURES if self.noise_scale else 0


def step_spec(spec: StepSpec | int, **fields: Any) -> StepSpec:
    """``spec`` (or a spec of ``spec`` subdivisions) with ``fields`` replaced: ``step_spec(3, feed=Feed.SUB_BATCH)``.

    Raises:
        TypeError: a field that :class:`StepSpec` does not have.
    """
    base = spec if isinstance(spec, StepSpec) else StepSpec(subdivisions=spec)
    return dataclasses.replace(base, **fields) if fields else base


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
        self._subdivisions = spec.subdivisions
        self._scale_loss = scale_loss
        self._metrics = spec.metrics
        self._batch_norm = (
            spec.batch_norm if spec.batch_norm is not None else BatchNormStatistics(model, BatchNormMode.SUB_BATCH)
        )
        self._draws = spec.draws
        self._noise_scale = spec.noise_scale
        self._training = not spec.inference_mode
        self._variables = model.trainable_variables
        # With XLA, each sub-batch of unknown shape is one cluster, compiled once per sub-batch shape.
        self._clustered = tf.function(self.add, jit_compile=True, reduce_retracing=True) if spec.jit_compile else None

    def units(self, y: Targets) -> tf.Tensor:
        """The units of the batch ``y`` holds (float32): its samples, or its real tokens."""
        return tf.reduce_sum(self._objective.units(y))

    def __call__(self, x: tf.Tensor, y: Targets, total: tf.Tensor | None = None, first_row: Any = 0) -> Totals:
        totals: Totals = (
            [tf.zeros_like(v, dtype=tf.float32) for v in self._variables],
            tf.constant(0.0, tf.float32),
            tf.zeros([2], tf.float32),
        )
        n_float = tf.cast(self.units(y) if total is None else total, tf.float32)
        for loop in sub_batch_loops(x, y, self._subdivisions):
            add = self._clustered if self._clustered is not None and not loop.static else self.add
            totals = self._sum(loop, add, n_float, totals, first_row)
        return totals

    def _sum(
        self, loop: SubBatchLoop, add: Callable[..., Totals], n_float: tf.Tensor, totals: Totals, offset: Any
    ) -> Totals:
        """Add the sub-batches of ``loop`` to ``totals`` in a ``tf.while_loop``, so there is no Python round-trip per
        sub-batch."""

        def body(k: tf.Tensor, gradients: list[tf.Tensor], loss_sum: tf.Tensor, noise: tf.Tensor) -> tuple[Any, ...]:
            x_sub, y_sub, first_row = loop.take(loop.indices[k])
            gradients, sub_loss_sum, sub_noise = add(x_sub, y_sub, offset + first_row, n_float, gradients)
            return k + 1, gradients, loss_sum + sub_loss_sum, noise + sub_noise

        count = tf.shape(loop.indices)[0]
        _, gradients, loss_sum, noise = tf.while_loop(
            lambda k, *_: k < count,
            body,
            (tf.constant(0), *totals),
            # One iteration at a time: by default the loop may overlap up to 10 sub-batches, and with them their
            # activations, which is the memory that subdivisions exist to save.
            parallel_iterations=PARALLEL_SUB_BATCHES,
        )
        return gradients, loss_sum, noise

    def add(
        self, x_sub: tf.Tensor, y_sub: Targets, first_row: tf.Tensor, n_float: tf.Tensor, gradients: list[tf.Tensor]
    ) -> Totals:
        """One sub-batch forward and backward: ``gradients`` plus its share of the batch's, its loss sum, and its
        part of the noise estimate (zeros without ``noise_scale``)."""
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
                sub_loss_sum += regularization(self._model) * self.units(y_sub)
            batch_share = sub_loss_sum / n_float
            if self._scale_loss is not None:
                batch_share = self._scale_loss(batch_share)
        # A variable the loss does not reach (an unused pooler) gets None: its accumulator stays as it is. (TF's
        # UnconnectedGradients.ZERO fails on Keras variables, whose dtype is a string.)
        sub_gradients = tape.gradient(batch_share, self._variables)
        if self._metrics is not None:
            self._metrics.update(y_sub, predictions)
        self._batch_norm.record(tf.shape(x_sub)[0])
        noise = sub_batch_part(sub_gradients, self.units(y_sub)) if self._noise_scale else tf.zeros([2], tf.float32)
        gradients = [
            g if d is None else g + tf.cast(tf.convert_to_tensor(d), tf.float32)
            for g, d in zip(gradients, sub_gradients, strict=True)
        ]
        return gradients, sub_loss_sum, noise


def make_gradient_fn(
    model: keras.Model,
    loss: Objective | LossFn,
    spec: StepSpec | int,
    *,
    scale_loss: Callable[[tf.Tensor], tf.Tensor] | None = None,
    **fields: Any,
) -> Accumulation:
    """A function ``(x, y, total=None, first_row=0) -> (gradients, loss_sum, noise_parts)`` that accumulates over
    the sub-batches, and whose ``units(y)`` counts a batch's units (samples, or real tokens).

    ``gradients`` is the gradient of the batch's mean loss per unit (plus the model's regularization losses) with
    respect to ``model.trainable_variables``; ``loss_sum`` is the sum of the per-sample losses, each unit with the
    regularization added (so ``loss_sum / units`` is the objective minimized, as Keras ``fit`` logs its loss);
    ``noise_parts`` what :mod:`accumrun.core.noise` needs of the sub-batches (zeros without ``spec.noise_scale``).
    ``spec.metrics``, when given, are updated with every sub-batch's samples. ``total`` is the unit count that the
    losses are divided by, ``y``'s own by default; a replica that holds one slice of a batch passes the whole
    batch's, so that the replicas' gradients sum to the batch's (see :func:`make_train_step`); an empty slice then
    gives zero gradients.
    ``first_row`` is where ``x`` starts in the global batch (a streamed sub-batch, a replica's slice). It is not
    compiled by itself: call it inside a ``tf.function`` (as the steps do) or eagerly in tests.

    ``spec`` is a :class:`StepSpec` or a subdivision count, ``fields`` any of its fields replaced (see
    :func:`step_spec`); the strategy and the feed are the step's, not used here. The batch is cut by
    :func:`accumrun.core.split.sub_batch_loops`: one loop per sub-batch size when the batch's
    size is known at tracing (full batches, and every batch of a step compiled whole by XLA), else one loop that
    cuts by index; the sum is the same, in another order. With ``spec.jit_compile``, each sub-batch of that one loop
    (forward pass, backward pass and accumulation) is one XLA cluster. ``scale_loss`` (a loss-scale
    optimizer's) multiplies each sub-batch's objective, so float16 gradients do not underflow; the gradients
    returned are then scaled by it too, and are accumulated in float32 whatever the compute dtype.
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


class _OneDevice:
    """Where a step without a strategy runs its per-replica parts: here, as the only replica."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def context(self) -> tf.distribute.ReplicaContext | None:
        return None

    def first_copy(self, values: Any) -> Any:
        return values


class _Replicas:
    """Where a replicated step runs its per-replica parts: on every replica of ``strategy``."""

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        self.strategy = strategy

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.strategy.run(fn, args=args)

    def context(self) -> tf.distribute.ReplicaContext | None:
        return tf.distribute.get_replica_context()

    def first_copy(self, values: Any) -> Any:
        """Replica 0's copy of ``values``, which the all-reduces made the same on every replica."""
        return tf.nest.map_structure(lambda v: self.strategy.experimental_local_results(v)[0], values)


Placement = _OneDevice | _Replicas

ApplyOrSkip = Callable[[Any, tf.Tensor], tf.Tensor]
"""``apply_or_skip(gradients, finite) -> applied``: the update, or none, in the cross-replica context."""


class Accumulated(NamedTuple):
    """What each replica has after accumulating a batch: its own metric state from before the batch and
    gradients, and over every replica the batch's totals ``[loss_sum, replicas that saw a NaN or Inf]``, its noise
    parts and the squared norm of its gradient (with ``noise_scale``, else zeros) and BatchNorm moments."""

    metrics_before: list[tf.Tensor]
    gradients: list[tf.Tensor]
    totals: tf.Tensor
    noise_parts: tf.Tensor
    batch_sq_norm: tf.Tensor
    moments: list[Moments]


class Finished(NamedTuple):
    """A batch after its update: the loss sum, whether the update was applied, and the noise parts over every
    replica and the squared norm of the batch's gradient (both zero without ``noise_scale``)."""

    loss_sum: tf.Tensor
    applied: tf.Tensor
    noise_parts: tf.Tensor
    batch_sq_norm: tf.Tensor


class BatchSequence:
    """What happens around every batch's accumulation, in this order, whichever step runs it:

    1. the BatchNorm moving statistics are kept as they are (:meth:`start`);
    2. on each replica, the metrics' state is kept and the BatchNorm record emptied (:meth:`open`);
    3. the step accumulates the batch's gradients, its own piece;
    4. on each replica, the loss sum, the non-finite count, the noise parts and the BatchNorm moments are totalled
       over the replicas, and with ``noise_scale`` the batch gradient's squared norm taken (:meth:`close`);
    5. the update is applied, or skipped when anything was not finite, the same on every replica
       (``apply_or_skip``, the step's other piece), the metrics put back unless it was applied, and the BatchNorm
       statistics moved once, or not at all (:meth:`finish`).

    :meth:`run` does it all in one call. A streamed batch spreads it over several: 1 and 2 before its first
    sub-batch, 3 in one call per sub-batch, 4 and 5 in the call after its last.
    """

    def __init__(
        self,
        metric_state: list[tf.Variable],
        batch_norm: BatchNormStatistics,
        apply_or_skip: ApplyOrSkip,
        placement: Placement,
        *,
        noise_scale: bool = False,
    ) -> None:
        self._metric_state = metric_state
        self._batch_norm = batch_norm
        self._apply_or_skip = apply_or_skip
        self._placement = placement
        self._noise_scale = noise_scale

    def run(self, accumulate: Callable[..., Totals], *args: Any) -> Finished:
        """One batch through the whole sequence; ``accumulate(*args)`` runs on each replica."""
        self.start()

        def on_replica(*replica_args: Any) -> Accumulated:
            metrics_before = self.open()
            return self.close(metrics_before, *accumulate(*replica_args))

        return self.finish(self._placement.run(on_replica, *args))

    def start(self) -> None:
        """Keep the BatchNorm moving statistics, from which the batch's one update starts."""
        self._batch_norm.save()

    def open(self) -> list[tf.Tensor]:
        """On a replica, before accumulating: empty the BatchNorm record; return the metrics' state, to put back
        if the batch is skipped."""
        self._batch_norm.reset()
        return [tf.identity(v) for v in self._metric_state]

    def close(
        self, metrics_before: list[tf.Tensor], gradients: list[tf.Tensor], loss_sum: tf.Tensor, noise: tf.Tensor
    ) -> Accumulated:
        """On a replica, after accumulating: total the loss, the non-finite count, the noise parts and the BatchNorm
        moments over every replica (one small all-reduce, and BatchNorm's own; with ``noise_scale``, one more of the
        gradients)."""
        context = self._placement.context()
        not_finite = tf.logical_not(_all_finite(loss_sum, gradients))
        totals = tf.stack([loss_sum, tf.cast(not_finite, tf.float32)])
        if self._noise_scale:
            totals = tf.concat([totals, noise], 0)
        if context is not None:
            totals = context.all_reduce(tf.distribute.ReduceOp.SUM, totals)
        batch_sq_norm = tf.constant(0.0, tf.float64)
        if self._noise_scale:
            # The replicas' gradients summed, as the update will sum them: one more all-reduce, of the gradients,
            # that only a replicated run measuring its noise pays.
            summed = gradients if context is None else context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
            batch_sq_norm = squared_norm(summed)
        moments = self._batch_norm.batch_moments(context)
        noise_parts = totals[2:] if self._noise_scale else noise
        return Accumulated(metrics_before, gradients, totals[:2], noise_parts, batch_sq_norm, moments)

    def finish(self, accumulated: Accumulated) -> Finished:
        """Apply or skip the update, put the metrics back unless it was applied, move the BatchNorm statistics."""
        totals, noise_parts, batch_sq_norm, moments = self._placement.first_copy(
            (accumulated.totals, accumulated.noise_parts, accumulated.batch_sq_norm, accumulated.moments)
        )
        applied = self._apply_or_skip(accumulated.gradients, tf.equal(totals[1], 0.0))
        if self._metric_state:

            def put_back() -> tf.Tensor:
                self._placement.run(self._assign_metrics, accumulated.metrics_before)
                return tf.constant(True)

            # A skipped batch's samples are not counted.
            tf.cond(applied, lambda: tf.constant(True), put_back)
        self._batch_norm.update(moments, applied)
        return Finished(totals[0], applied, noise_parts, batch_sq_norm)

    def _assign_metrics(self, values: list[tf.Tensor]) -> None:
        for variable, value in zip(self._metric_state, values, strict=True):
            variable.assign(value)


def _all_finite(loss_sum: tf.Tensor, gradients: list[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in [loss_sum, *gradients]])


def _apply_or_skip(
    optimizer: keras.optimizers.Optimizer, variables: list[tf.Variable], placement: Placement
) -> ApplyOrSkip:
    """The update of a batch whose gradients (on each replica) are finite; a loss-scale optimizer decides itself."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):

        def loss_scaled(gradients: list[tf.Tensor], finite: tf.Tensor) -> tf.Tensor:
            # It unscales and checks the gradients itself, and skips the update (lowering its scale) on overflow.
            updates_before = tf.identity(optimizer.iterations)
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return optimizer.iterations > updates_before

        return loss_scaled

    def update(gradients: list[tf.Tensor]) -> None:
        # On replicas, apply_gradients sums the replicas' gradients (the one gradient all-reduce), then updates.
        optimizer.apply_gradients(zip(gradients, variables, strict=True))

    def apply_if_finite(gradients: Any, finite: tf.Tensor) -> tf.Tensor:
        def apply() -> tf.Tensor:
            placement.run(update, gradients)
            return tf.constant(True)

        return tf.cond(finite, apply, lambda: tf.constant(False))

    return apply_if_finite


class TrainStep(ABC):
    """A compiled train step, as the epoch loop calls it: one batch in, one update."""

    @abstractmethod
    def train_batch(self, chunks: Iterable[Chunk], samples: int) -> BatchResult:
        """Train the batch of ``samples`` samples that ``chunks`` holds (the whole batch as one chunk, or its
        sub-batches in order, as the step takes them) and make its one update."""


class WholeBatchStep(TrainStep):
    """One batch, one compiled call: ``step(x, y) -> BatchResult``, on one device or on the replicas of a strategy;
    the batch is cut into its sub-batches on the device.

    The call traces at most twice per run: once for full batches and once, with a generalized shape, for a short
    last batch. Compiled with XLA (``jit_compile``), it traces once per batch shape instead, and under a strategy
    each sub-batch is compiled on its own (see :func:`make_gradient_fn`).
    """

    def __init__(self, compiled: Callable[[tf.Tensor, Targets], BatchResult]) -> None:
        self.compiled = compiled
        """The compiled step (a ``tf.function``)."""

    def __call__(self, x: tf.Tensor, y: Targets) -> BatchResult:
        return BatchResult(*self.compiled(x, y))

    def train_batch(self, chunks: Iterable[Chunk], samples: int) -> BatchResult:
        """Train the batch that ``chunks`` holds as its one chunk (it has all ``samples`` samples)."""
        ((x, y),) = chunks
        return self(x, y)


class StreamedStep(TrainStep):
    """A batch that does not fit on the device at once, as its sub-batches: one compiled call each adds a
    sub-batch to accumulators that persist between calls (variables), and one more makes the batch's update and
    clears them. Each sub-batch's loss sum is divided by the whole batch's sample count, and the gradients by
    units / samples before the update (see the module's docstring), so the update is the one
    :class:`WholeBatchStep` makes on the batch, to float rounding. Runs on one device; with ``jit_compile`` each
    sub-batch's call is compiled with XLA, once per sub-batch shape."""

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
        with tf.init_scope():
            self._gradients = [tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False) for v in variables]
            self._loss_sum = tf.Variable(0.0, trainable=False)
            self._units = tf.Variable(0.0, trainable=False)
            self._noise = tf.Variable(tf.zeros([2], tf.float32), trainable=False)
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
        total = tf.constant(samples, tf.float32)
        rows = 0
        for x, y in chunks:
            # The sub-batch's first row in the batch, for its random draws.
            self._add(x, y, total, tf.constant(rows, tf.int32))
            rows += int(x.shape[0])
        if not rows:
            raise ValueError("a streamed batch needs at least one sub-batch")
        return BatchResult(*self._end(metrics_before, total))

    def _add_sub_batch(self, x: tf.Tensor, y: Targets, total: tf.Tensor, first_row: tf.Tensor) -> tf.Tensor:
        gradients, loss_sum, noise = self._sub_batch_gradients(x, y, total, first_row)
        for accumulator, gradient in zip(self._gradients, gradients, strict=True):
            accumulator.assign_add(gradient)
        self._loss_sum.assign_add(loss_sum)
        self._noise.assign_add(noise)
        self._units.assign_add(self._sub_batch_gradients.units(y))
        return loss_sum

    def _end_batch(self, metrics_before: list[tf.Tensor], samples: tf.Tensor) -> tuple[tf.Tensor, ...]:
        units = tf.identity(self._units)
        # The sub-batches were divided by the batch's samples; the batch's mean is over its units.
        to_units = samples / units
        gradients = [g * to_units for g in self._gradients]
        loss_scale = self._measure.loss_scale()
        accumulated = self._sequence.close(
            metrics_before, gradients, tf.identity(self._loss_sum), tf.identity(self._noise)
        )
        finished = self._sequence.finish(accumulated)
        for accumulator in self._gradients:
            accumulator.assign(tf.zeros_like(accumulator))
        self._loss_sum.assign(0.0)
        self._units.assign(0.0)
        self._noise.assign(tf.zeros([2], tf.float32))
        return finished.loss_sum, units, finished.applied, self._measure(finished, samples, units, loss_scale)


def make_train_step(
    model: keras.Model,
    loss: Objective | LossFn,
    optimizer: keras.optimizers.Optimizer,
    spec: StepSpec | int,
    **fields: Any,
) -> TrainStep:
    """Compile the train step that ``spec`` describes: accumulate over sub-batches, then update once.

    ``spec`` is a :class:`StepSpec`, or a subdivision count; ``fields`` replace any of its fields (see
    :func:`step_spec`), so ``make_train_step(model, loss, optimizer, 3, feed=Feed.SUB_BATCH)`` reads as it says.

    The optimizer sees one ``apply_gradients`` per batch, so clipping, weight decay, its iteration counter and
    learning-rate schedules all count batches. A batch whose loss or gradient is NaN or Inf is not applied: the
    weights, the optimizer state and the metrics stay as they were, and the caller decides whether to stop
    or go on. A ``keras.optimizers.LossScaleOptimizer`` scales each sub-batch's loss; it unscales and checks the
    accumulated gradients once per batch, and skips (lowering its scale) a batch whose gradients overflowed.

    ``spec.feed`` is how batches arrive: whole (a :class:`WholeBatchStep`, which cuts them into
    ``spec.subdivisions``), or as the sub-batches the caller cut (a :class:`StreamedStep`). ``loss`` is an
    :class:`~accumrun.core.losses.Objective`, or a bare per-sample loss of class indices. ``spec.metrics`` are updated
    with every sub-batch's samples. With ``per_batch`` or ``precise`` BatchNorm statistics (``spec.batch_norm``) the
    moving statistics move once per batch, from the batch's moments over every sub-batch and replica, or not at all
    when the batch is skipped. ``spec.draws`` has the random layers draw each sample's masks from the update and its
    row in the global batch, whatever the subdivisions, feed and replicas. With ``spec.strategy``, the global batch is
    dealt out to the replicas (see the module's docstring). ``spec.jit_compile`` compiles with XLA (see
    :class:`WholeBatchStep` and :func:`make_gradient_fn`). ``spec.bucket`` pads each sub-batch of token ids only to its
    longest sequence, rounded up to a multiple of it (the model must take any length).

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
    placement: Placement = _Replicas(strategy) if strategy is not None else _OneDevice()
    if spec.batch_norm is None:
        spec = dataclasses.replace(spec, batch_norm=BatchNormStatistics(model, BatchNormMode.SUB_BATCH))
    assert spec.batch_norm is not None
    metric_state = spec.metrics.variables if spec.metrics is not None else []
    sequence = BatchSequence(
        metric_state,
        spec.batch_norm,
        _apply_or_skip(optimizer, variables, placement),
        placement,
        noise_scale=spec.noise_scale,
    )
    scale_loss = optimizer.scale_loss if loss_scaled else None
    measure = BatchMeasures(spec.noise_scale, scale_loss)
    if spec.feed is Feed.SUB_BATCH:
        # A streamed sub-batch is a batch of one subdivision, its losses divided by the whole batch's count; the
        # step compiles each sub-batch's call whole, with XLA when asked.
        sub_batch = make_gradient_fn(model, loss, spec, scale_loss=scale_loss, subdivisions=1, jit_compile=False)
        return StreamedStep(sequence, sub_batch, variables, measure, jit_compile=spec.jit_compile)
    accumulate = make_gradient_fn(model, loss, spec, scale_loss=scale_loss)
    if strategy is not None:
        return _replicated_step(strategy, sequence, accumulate, measure)
    return _one_device_step(sequence, accumulate, measure, jit_compile=spec.jit_compile)


class BatchMeasures:
    """What a step measures of each batch beside its update: with ``noise_scale``, the noise estimates
    (:func:`accumrun.core.noise.estimates`), unscaled by ``scale_loss`` (a loss-scale optimizer's); else nothing,
    at no cost."""

    def __init__(self, noise_scale: bool, scale_loss: Callable[[tf.Tensor], tf.Tensor] | None) -> None:
        self._noise_scale = noise_scale
        self._scale_loss = scale_loss

    def loss_scale(self) -> tf.Tensor:
        """The loss scale now (read before the update, which may change it)."""
        if self._scale_loss is None or not self._noise_scale:
            return tf.constant(1.0)
        return tf.cast(self._scale_loss(tf.constant(1.0)), tf.float32)

    def __call__(self, finished: Finished, divided_by: tf.Tensor, units: tf.Tensor, loss_scale: tf.Tensor) -> tf.Tensor:
        """The batch's measures, its sub-batches' loss sums having been divided by ``divided_by``."""
        if not self._noise_scale:
            return tf.zeros([0], tf.float64)
        return estimates(finished.noise_parts, finished.batch_sq_norm, divided_by, units, loss_scale)


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
        return WholeBatchStep(tf.function(train_step, jit_compile=True, autograph=False))
    return WholeBatchStep(tf.function(train_step, reduce_retracing=True, autograph=False))


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

    return WholeBatchStep(train_step)


def make_eval_step(
    model: keras.Model, loss: Objective | LossFn, metrics: MetricSet | None = None
) -> Callable[[tf.Tensor, Targets], tuple[tf.Tensor, tf.Tensor]]:
    """Compile ``evaluate(x, y) -> (loss_sum, units)`` in inference mode (BatchNorm uses its moving statistics),
    each sample's loss times its weight when ``y`` carries weights, the regularization counted with every unit
    (sample or real token) as training counts it; it adds the samples to ``metrics``, unweighted."""
    objective = loss if isinstance(loss, Objective) else Objective(loss)

    @tf.function(reduce_retracing=True)
    def eval_step(x: tf.Tensor, y: Targets) -> tuple[tf.Tensor, tf.Tensor]:
        predictions = model(x, training=False)
        if metrics is not None:
            metrics.update(y, predictions)
        loss_sum = tf.reduce_sum(objective.per_sample_loss(y, predictions))
        units = tf.reduce_sum(objective.units(y))
        if model.losses:
            # As Keras' evaluate reports it: the regularization counts in the loss of every sample.
            loss_sum += regularization(model) * units
        return loss_sum, units

    return eval_step
