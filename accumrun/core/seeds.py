"""Random draws inside the step: per sample for the stochastic layers accumrun knows, per sub-batch for the rest.

The layers of :data:`accumrun.core.draws.PER_SAMPLE_LAYERS` (``Dropout`` and its spatial kin, the Gaussian
layers, ``AlphaDropout``; wherever they sit: inside ``MultiHeadAttention``, an application, a saved model) draw
per sample. Inside the step, in training mode, a call draws each sample's mask or noise from the layer's initial
seed, the call's place in the forward pass, the update (the optimizer's step counter, restored on resume) and the
sample's row in the global batch, and from nothing else. So the subdivisions, the feed, the replicas and the
number of workers never change what a sample sees, and a model without BatchNorm in training mode trains the same
subdivided or not. Outside the step (inference, a user's own call) each layer is Keras' own.

Any other layer that holds a ``SeedGenerator`` (a custom layer, an RNN cell's dropout) draws as Keras makes it,
from a generator that is set before each sub-batch to a function of its initial seed, the update, the replica
and the sub-batch's first row: its draws repeat for a seed and across a resume, and differ between replicas and
sub-batches, but the subdivisions change them; :meth:`LayerDraws.describe` names those layers at startup.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from accumrun.core.draws import PER_SAMPLE_LAYERS, row_bits
from accumrun.core.recompute import replayable
from accumrun.kinds import RandomDraws


class _PerSampleCall:
    """A known layer's ``call``: per-sample draws while :class:`LayerDraws` has a sub-batch open on this thread
    and the call trains, else the layer's own ``call``."""

    def __init__(self, draws: LayerDraws, layer: keras.layers.Layer, original: Any) -> None:
        self.draws, self.layer, self.original = draws, layer, original

    def __call__(self, inputs: Any, training: Any = False, **kwargs: Any) -> Any:
        rows = self.draws.open_rows()
        if rows is None or training is not True or not _draws_at_all(self.layer):
            return self.original(inputs, training=training, **kwargs)
        key = self.draws.call_key(self.layer)
        return PER_SAMPLE_LAYERS[type(self.layer)](self.layer, inputs, lambda shape: row_bits(key, rows, shape))


def _draws_at_all(layer: keras.layers.Layer) -> bool:
    return float(getattr(layer, "rate", getattr(layer, "stddev", 0.0))) > 0.0


class LayerDraws:
    """The random layers of ``model`` and how each draws inside the step (see the module's docstring), with
    ``updates``, the optimizer's step counter that numbers the updates. Make it before a checkpoint is restored:
    it reads the generators' initial seeds. ``mode`` ``per_sub_batch`` leaves every layer to per-sub-batch draws
    (how accumrun drew before; runs started so resume so)."""

    def __init__(self, model: keras.Model, updates: tf.Variable, mode: RandomDraws = RandomDraws.PER_SAMPLE) -> None:
        self.mode = mode
        layers = list(model._flatten_layers(include_self=True, recursive=True))
        per_sample = mode is RandomDraws.PER_SAMPLE
        # A layer of rate 0 (Keras then makes no seed generator) draws nothing.
        known = [
            layer
            for layer in layers
            if per_sample and type(layer) in PER_SAMPLE_LAYERS and hasattr(layer, "seed_generator")
        ]
        self.per_sample_layers: list[keras.layers.Layer] = known
        self.other_layers: list[keras.layers.Layer] = [
            layer for layer in layers if getattr(layer, "_seed_generators", None) and not any(layer is k for k in known)
        ]
        self._keys = {id(layer): _initial_seed(layer.seed_generator) for layer in known}
        self._generators = [g for layer in self.other_layers for g in layer._seed_generators]
        self._bases = [_initial_seed(g) for g in self._generators]
        self._updates = updates
        self._open = threading.local()  # MirroredStrategy traces each replica's forward pass on a thread of its own
        for layer in known:
            original = layer.call.original if isinstance(layer.call, _PerSampleCall) else layer.call
            layer.call = _PerSampleCall(self, layer, original)

    def __bool__(self) -> bool:
        return bool(self.per_sample_layers or self.other_layers)

    @contextlib.contextmanager
    def sub_batch(self, first_row: tf.Tensor, rows: tf.Tensor) -> Iterator[None]:
        """Around a sub-batch's forward pass: its ``rows`` samples start at row ``first_row`` of the global
        batch."""
        self._reseed_others(first_row)
        self._open.rows = tf.cast(first_row, tf.int64) + tf.range(tf.cast(rows, tf.int64))
        self._open.calls = {}
        try:
            with replayable(self._replay_point):
                yield
        finally:
            self._open.rows = None

    def _replay_point(self) -> Callable[[], contextlib.AbstractContextManager[None]]:
        """The open forward pass as it stands, for a recomputation (:mod:`accumrun.core.recompute`) to draw again
        what the calls from here draw: the same rows, and each layer's calls counted from the same place."""
        rows, calls = self._open.rows, dict(self._open.calls)

        @contextlib.contextmanager
        def replay() -> Iterator[None]:
            before = (self._open.rows, self._open.calls)
            self._open.rows, self._open.calls = rows, dict(calls)
            try:
                yield
            finally:
                self._open.rows, self._open.calls = before

        return replay

    def open_rows(self) -> tf.Tensor | None:
        """The open sub-batch's global rows on this thread, or None outside :meth:`sub_batch`."""
        return getattr(self._open, "rows", None)

    def call_key(self, layer: keras.layers.Layer) -> tf.Tensor:
        """The key of ``layer``'s next call in the open forward pass: its initial seed, how many times it was called
        before in this pass (a layer used twice draws twice), and the update."""
        calls: dict[int, int] = self._open.calls
        index = calls.get(id(layer), 0)
        calls[id(layer)] = index + 1
        key = tf.random.experimental.stateless_fold_in(self._keys[id(layer)], index)
        return tf.random.experimental.stateless_fold_in(key, tf.cast(self._updates, tf.int64))

    def describe(self) -> list[str]:
        """The startup line: which layers draw per sample, and any whose draws depend on the subdivisions."""
        lines = []
        if self.per_sample_layers:
            lines.append(
                f"random layers draw per sample ({_names(self.per_sample_layers)}): subdivisions do not change them"
            )
        if self.other_layers and self.mode is RandomDraws.PER_SUB_BATCH:
            lines.append(
                f"random layers draw per sub-batch ({_names(self.other_layers)}; training.random_draws: "
                "per_sub_batch): subdivisions change their draws"
            )
        elif self.other_layers:
            lines.append(
                f"{_names(self.other_layers)} draw{'s' if len(self.other_layers) == 1 else ''} randomness accumrun "
                "does not know: drawn per sub-batch, so subdivisions change the run (exactness is not promised)"
            )
        return lines

    def describe_off(self, why: str) -> list[str]:
        """The startup line of a run whose step calls the model in inference mode for ``why``: the random layers
        that are therefore off."""
        layers = [*self.per_sample_layers, *self.other_layers]
        if not layers:
            return []
        return [f"random layers off for {why} ({_names(layers)}): its objective must be a function of the weights"]

    def _reseed_others(self, first_row: tf.Tensor) -> None:
        if not self._generators:
            return
        replica = tf.distribute.get_replica_context()
        replica_id = replica.replica_id_in_sync_group if replica is not None else 0
        data = [
            tf.cast(self._updates, tf.int64),
            tf.cast(replica_id, tf.int64),
            tf.cast(first_row, tf.int64),
            tf.constant(0, tf.int64),  # the counter that the layer advances from here
        ]
        for generator, base in zip(self._generators, self._bases, strict=True):
            state = base
            for value in data:
                state = tf.cast(tf.random.experimental.stateless_fold_in(state, value), tf.int64)
            generator.state.assign(tf.cast(state, generator.state.dtype))


def _initial_seed(generator: keras.random.SeedGenerator) -> tf.Tensor:
    return tf.constant(keras.ops.convert_to_numpy(generator.state.value), tf.int64)


def _names(layers: list[keras.layers.Layer]) -> str:
    shown = ", ".join(f"{layer.name} ({type(layer).__name__})" for layer in layers[:4])
    return shown + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
