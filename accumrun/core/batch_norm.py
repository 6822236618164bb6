"""BatchNorm under accumulation: what a BatchNormalization layer normalizes with, and when its moving
statistics change (``training.batch_norm``).

One forward pass over a sub-batch can only normalize with that sub-batch's mean and variance (ghost batch
normalization, as darknet does); what accumrun chooses is everything around it:

- ``sub_batch``: Keras' own behaviour inside the loop: the moving statistics move once per sub-batch, so
  their momentum per batch depends on the subdivisions.
- ``per_batch``: the moving statistics move once per batch, with the whole batch's mean and variance. Each
  sub-batch's moments are read as the layer computes them, and combined exactly (Chan et al.'s pairwise rule,
  the law of total variance weighted by sample count), so uneven sub-batches are exact too; under
  ``tf.distribute`` the replicas' moments are combined the same way, by two all-reduces.
- ``precise``: ``per_batch``, and at the end of each epoch :class:`PopulationStatistics` replaces every moving
  mean and variance by the training set's, under the final weights (PreciseBN, Wu and Johnson 2021).
- ``frozen``: every BatchNorm runs in inference mode with its moving statistics, which do not change; its
  gamma and beta still train. Training is then the same with any subdivisions.

How the moments are read: while a step is traced, each BatchNorm's ``call`` is wrapped so that its momentum is
0 for that call. Keras then writes the sub-batch's own mean and variance into the moving statistics, exactly,
where the step reads them; the batch's update, at its end, starts again from the values saved before the batch.
Nothing is patched outside tracing, so the saved model and its config are untouched. A layer that is not
trainable (a frozen base) already runs in inference mode and is left alone, as are layers with ``renorm``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import keras
import tensorflow as tf

from accumrun.core.sub_batches import piece_loop, replica_rows
from accumrun.kinds import BatchNormMode

_RECORDING_MODES = (BatchNormMode.PER_BATCH, BatchNormMode.PRECISE)
"""The modes whose BatchNorm layers move once per batch, from the moments recorded over its sub-batches."""
Moments = tuple[tf.Tensor, tf.Tensor, tf.Tensor]
"""A layer's ``(count, mean, variance)`` over the samples seen."""
Running = tuple[tf.Tensor, tf.Tensor, tf.Tensor]
"""``(count, mean, M2)``: M2 is the sum of squared deviations from the mean, which combines exactly."""


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """Every BatchNormalization layer of ``model``, nested models included."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


class BatchNormStatistics:
    """The BatchNorm layers of a model under one ``mode``, and the per-batch moments of those whose moving
    statistics ``per_batch`` and ``precise`` update: each one's sample count, mean and sum of squared deviations,
    accumulated over a batch's sub-batches in variables (replica-local under a strategy), so that sub-batches
    streamed in separate calls add up too.

    The step calls every recording method in every mode: where nothing is recorded (``sub_batch``, ``frozen``, a
    model without BatchNorm) they do nothing, so that the step has no case of its own for them.
    """

    def __init__(self, model: keras.Model, mode: BatchNormMode, strategy: tf.distribute.Strategy | None = None) -> None:
        self.mode = mode
        self.layers = batch_norm_layers(model)
        self.tracked = [layer for layer in self.layers if layer.trainable and not layer.renorm]
        scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
        local = {"synchronization": tf.VariableSynchronization.ON_READ, "aggregation": tf.VariableAggregation.SUM}
        recorded = self._recorded
        with scope, tf.init_scope():
            self._count = [tf.Variable(_zeros(layer, []), trainable=False, **local) for layer in recorded]
            self._mean = [tf.Variable(_zeros(layer), trainable=False, **local) for layer in recorded]
            self._m2 = [tf.Variable(_zeros(layer), trainable=False, **local) for layer in recorded]
            # The moving statistics before the batch, from which its one update starts.
            self._saved = [
                (tf.Variable(_zeros(layer), trainable=False), tf.Variable(_zeros(layer), trainable=False))
                for layer in recorded
            ]

    @property
    def records(self) -> bool:
        """Whether the step combines the sub-batches' moments (``per_batch`` and ``precise``)."""
        return bool(self._recorded)

    @property
    def _recorded(self) -> list[keras.layers.BatchNormalization]:
        return self.tracked if self.mode in _RECORDING_MODES else []

    @contextlib.contextmanager
    def tracing(self, force_training: bool = False) -> Iterator[None]:
        """Wrap the layers' ``call`` while a step is traced: momentum 0 where moments are recorded, inference
        mode for ``frozen``; with ``force_training``, recorded layers run in training mode whatever the model
        is called with (the population pass, with dropout off)."""
        if self.mode is BatchNormMode.FROZEN:
            wrapped = {id(layer): _inference(layer) for layer in self.layers}
        elif self._recorded:
            wrapped = {id(layer): _recording(layer, force_training) for layer in self._recorded}
        else:
            wrapped = {}
        layers = [layer for layer in self.layers if id(layer) in wrapped]
        # A layer's own call may already be wrapped (recomputed, training.remat): that wrapper comes back after.
        before = {id(layer): layer.__dict__.get("call") for layer in layers}
        for layer in layers:
            layer.call = wrapped[id(layer)]
        try:
            yield
        finally:
            for layer in layers:
                if before[id(layer)] is None:
                    del layer.call
                else:
                    layer.call = before[id(layer)]

    def moving(self) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """The recorded layers' moving mean and variance now."""
        return [(tf.identity(layer.moving_mean), tf.identity(layer.moving_variance)) for layer in self._recorded]

    def save(self) -> None:
        """Keep the moving statistics as they are before a batch (on one device, or in the cross-replica context)."""
        for (mean, variance), (saved_mean, saved_variance) in zip(self.moving(), self._saved, strict=True):
            saved_mean.assign(mean)
            saved_variance.assign(variance)

    def reset(self) -> None:
        """Start a batch with no samples recorded (on each replica)."""
        for count, mean, m2 in zip(self._count, self._mean, self._m2, strict=True):
            count.assign(0.0)
            mean.assign(tf.zeros_like(mean))
            m2.assign(tf.zeros_like(m2))

    def record(self, samples: tf.Tensor) -> None:
        """Add the moments that the last forward pass over ``samples`` rows wrote into the moving statistics."""
        for layer, count, mean, m2 in zip(self._recorded, self._count, self._mean, self._m2, strict=True):
            n_b = tf.cast(samples, count.dtype)
            sub_batch = (
                n_b,
                tf.convert_to_tensor(layer.moving_mean),
                tf.convert_to_tensor(layer.moving_variance) * n_b,
            )
            n, combined_mean, combined_m2 = _combine(
                (count.read_value(), mean.read_value(), m2.read_value()), sub_batch
            )
            count.assign(n)
            mean.assign(combined_mean)
            m2.assign(combined_m2)

    def batch_moments(self, replica_context: tf.distribute.ReplicaContext | None = None) -> list[Moments]:
        """The batch's ``(count, mean, variance)`` per recorded layer; in a replica context, over every replica:
        two all-reduces, of the counts and sums, then of the squared deviations from the global mean. Nothing
        (and no all-reduce) where nothing is recorded."""
        if not self._recorded:
            return []
        counts = [c.read_value() for c in self._count]
        means = [m.read_value() for m in self._mean]
        m2s = [m.read_value() for m in self._m2]
        if replica_context is not None:
            sums = [c * m for c, m in zip(counts, means, strict=True)]
            total_counts, total_sums = replica_context.all_reduce(tf.distribute.ReduceOp.SUM, (counts, sums))
            global_means = [s / tf.maximum(n, 1.0) for s, n in zip(total_sums, total_counts, strict=True)]
            deviations = [
                m2 + c * tf.square(m - g) for m2, c, m, g in zip(m2s, counts, means, global_means, strict=True)
            ]
            m2s = replica_context.all_reduce(tf.distribute.ReduceOp.SUM, deviations)
            counts, means = list(total_counts), global_means
        return [(c, m, m2 / tf.maximum(c, 1.0)) for c, m, m2 in zip(counts, means, m2s, strict=True)]

    def update(self, moments: list[Moments], applied: tf.Tensor) -> None:
        """Move each recorded layer's statistics once, from the saved ones, by the batch's ``moments``; a skipped
        batch (``applied`` false) or a layer that saw no sample gets the saved ones back."""
        for layer, (count, mean, variance), (mean_before, variance_before) in zip(
            self._recorded, moments, self._saved, strict=True
        ):
            keep = tf.logical_or(tf.logical_not(applied), tf.equal(count, 0.0))
            momentum = layer.momentum
            layer.moving_mean.assign(tf.where(keep, mean_before, mean_before * momentum + mean * (1.0 - momentum)))
            layer.moving_variance.assign(
                tf.where(keep, variance_before, variance_before * momentum + variance * (1.0 - momentum))
            )

    def set_population(self, moments: list[Moments]) -> None:
        """Make each recorded layer's moving statistics ``moments``' mean and variance (the saved ones for a layer
        that saw no sample)."""
        for layer, (count, mean, variance), (mean_before, variance_before) in zip(
            self._recorded, moments, self._saved, strict=True
        ):
            seen = count > 0.0
            layer.moving_mean.assign(tf.where(seen, mean, mean_before))
            layer.moving_variance.assign(tf.where(seen, variance, variance_before))

    def describe(self, sub_batch: int) -> list[str]:
        """The startup lines: the layers and the mode, and a warning for sub-batches too small to normalize."""
        if not self.layers:
            return []
        lines = [f"batch norm: {len(self.layers)} BatchNormalization layers, {self.mode} ({_MEANING[self.mode]})"]
        if self.mode is not BatchNormMode.FROZEN and self.tracked and sub_batch < 8:
            lines.append(
                f"warning: BatchNorm normalizes each sub-batch of {sub_batch} sample{'s' if sub_batch != 1 else ''} "
                "per replica with its own statistics, which are noisy below 8; consider training.batch_norm: frozen, "
                "fewer subdivisions, or GroupNormalization"
            )
        return lines


_MEANING = {
    BatchNormMode.SUB_BATCH: "moving statistics move once per sub-batch",
    BatchNormMode.PER_BATCH: "moving statistics move once per batch, from the whole batch's moments",
    BatchNormMode.PRECISE: "once per batch, and recomputed over the training set at each epoch's end",
    BatchNormMode.FROZEN: "inference mode, moving statistics fixed",
}


class PopulationStatistics:
    """``batch_norm: precise``'s end of epoch: every recorded layer's moving mean and variance set to those of
    the training samples under the current weights, in one forward pass over them.

    Each chunk of samples is one compiled call (dealt out to the replicas under a ``strategy``), which runs
    pieces of at most ``piece`` samples in a loop, with each BatchNorm in training mode (normalizing with the
    piece's moments, as in training) and dropout off. The pieces' moments combine exactly, as a batch's
    sub-batches do. A layer's input depends on the layers before it, which normalize with each piece's own
    moments, so only a BatchNorm whose input does not depend on another BatchNorm gets the population statistics
    exactly; this is PreciseBN's approximation, with pieces of the size of training's sub-batches.
    """

    def __init__(
        self,
        model: keras.Model,
        statistics: BatchNormStatistics,
        piece: int,
        strategy: tf.distribute.Strategy | None = None,
    ) -> None:
        self._statistics = statistics

        def add(x: tf.Tensor) -> None:
            indices, take = piece_loop(x, piece)
            for i in indices:
                # One piece's activations at a time, as in the training step's loop.
                tf.autograph.experimental.set_loop_options(parallel_iterations=1)
                part = take(i)
                with statistics.tracing(force_training=True):
                    model(part, training=False)
                statistics.record(tf.shape(part)[0])

        def moments() -> list[Moments]:
            return statistics.batch_moments(tf.distribute.get_replica_context() if strategy is not None else None)

        if strategy is None:
            self._add = tf.function(add, reduce_retracing=True)
            self._reset = tf.function(statistics.reset)
            self._moments = tf.function(moments)
            return
        replicas = strategy.num_replicas_in_sync

        @tf.function(reduce_retracing=True)
        def add_on_replicas(x: tf.Tensor) -> None:
            def replica_slice(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
                (part,) = replica_rows((x,), context.replica_id_in_sync_group, replicas)
                return part

            strategy.run(add, args=(strategy.experimental_distribute_values_from_function(replica_slice),))

        @tf.function
        def moments_everywhere() -> list[Moments]:
            # After the all-reduces every replica holds the same moments; any local copy will do.
            everywhere = strategy.run(moments)
            return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], everywhere)

        self._add = add_on_replicas
        self._reset = tf.function(lambda: strategy.run(statistics.reset))
        self._moments = moments_everywhere

    def __call__(self, chunks: Iterable[tf.Tensor]) -> None:
        """Recompute the statistics over ``chunks``."""
        self._statistics.save()
        self._reset()
        for x in chunks:
            self._add(x)
        self._statistics.set_population(self._moments())


def _zeros(layer: keras.layers.BatchNormalization, shape: list[int] | None = None) -> tf.Tensor:
    """Zeros shaped as the layer's moving statistics (or ``shape``), in their dtype: float32 (under mixed precision
    too), or float64."""
    return tf.zeros(layer.moving_mean.shape if shape is None else shape, layer.moving_mean.dtype)


def _combine(a: Running, b: Running) -> Running:
    """Chan et al.'s pairwise combination of two :data:`Running` totals."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    share = tf.math.divide_no_nan(n_b, n)
    delta = mean_b - mean_a
    return n, mean_a + delta * share, m2_a + m2_b + tf.square(delta) * n_a * share


def _recording(layer: keras.layers.BatchNormalization, force_training: bool) -> Callable[..., Any]:
    original = layer.call

    def call(inputs: Any, training: Any = None, mask: Any = None) -> Any:
        momentum = layer.momentum
        layer.momentum = 0.0  # read while tracing: the sub-batch's moments land in the moving statistics
        try:
            return original(inputs, training=True if force_training else training, mask=mask)
        finally:
            layer.momentum = momentum

    return call


def _inference(layer: keras.layers.BatchNormalization) -> Callable[..., Any]:
    original = layer.call

    def call(inputs: Any, training: Any = None, mask: Any = None) -> Any:
        return original(inputs, training=False, mask=mask)

    return call
