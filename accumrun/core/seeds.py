"""Random draws inside the step (dropout masks, noise layers): each sub-batch of each replica draws its own.

A Keras layer that draws (``Dropout``, ``GaussianNoise``, ...) reads a ``SeedGenerator``: a ``[seed, counter]``
variable that it advances at every draw. Across replicas that variable starts equal, so every replica would draw
the masks of the others. Before each sub-batch's forward pass the step therefore sets every generator's state to
a function of the generator's initial seed, the update (the optimizer's step counter, restored on resume), the
replica and the sub-batch (its first row in the replica's slice): draws repeat exactly for a seed, a resumed
run draws what an uninterrupted one did, and replicas and sub-batches differ. The same sub-batch streamed in a
call of its own draws the same masks as inside a whole batch.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class SubBatchSeeds:
    """The ``SeedGenerator`` of every layer of ``model``, with their initial seeds (read when this is made, before
    a checkpoint is restored), and the optimizer step counter that numbers the updates."""

    def __init__(self, model: keras.Model, updates: tf.Variable) -> None:
        self._generators = [
            generator
            for layer in model._flatten_layers(include_self=True, recursive=True)
            for generator in getattr(layer, "_seed_generators", [])
        ]
        self._bases = [tf.constant(keras.ops.convert_to_numpy(g.state.value), tf.int64) for g in self._generators]
        self._updates = updates

    def __bool__(self) -> bool:
        return bool(self._generators)

    def reseed(self, first_row: tf.Tensor) -> None:
        """Set every generator for the sub-batch at ``first_row`` of this replica's slice, in this update."""
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
