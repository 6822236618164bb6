"""Dropout under accumulation: every sub-batch draws its own masks, from the seed and the update alone, so runs
repeat exactly, a resumed run draws what an uninterrupted one did, and streamed sub-batches draw what the
whole-batch step draws."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import train
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.seeds import SubBatchSeeds
from accumrun.core.step import make_train_step
from accumrun.kinds import Feed
from tests.helpers import max_difference


def sections(**training: Any) -> dict[str, Any]:
    return {
        "seed": 4,
        "data": {"name": "synthetic", "samples": 40, "shape": [6], "classes": 3, "validation_split": 0.1},
        "model": {"name": "mlp", "hidden": [32], "dropout": 0.5},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": 3, **training},
        "output": {"tensorboard": False},
    }


def test_sub_batches_draw_different_masks_that_repeat_for_the_same_update() -> None:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((200,))
    model = keras.Model(inputs, keras.layers.Dropout(0.5)(inputs))
    updates = tf.Variable(0, dtype=tf.int64)
    seeds = SubBatchSeeds(model, updates)

    @tf.function
    def masks(first_row: int) -> tf.Tensor:
        seeds.reseed(tf.constant(first_row))
        return model(tf.ones((1, 200)), training=True)

    first, again, other = masks(0), masks(0), masks(3)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert not np.array_equal(first.numpy(), other.numpy())
    updates.assign(1)
    assert not np.array_equal(masks(0).numpy(), first.numpy())


@pytest.mark.slow
def test_dropout_runs_repeat_and_resume_exactly(tmp_path: Path) -> None:
    whole = train(sections(), tmp_path / "whole", quiet=True)
    again = train(sections(), tmp_path / "again", quiet=True)
    assert max_difference(again.model.get_weights(), whole.model.get_weights()) == 0.0
    train({**sections(epochs=1)}, tmp_path / "resumed", quiet=True)
    resumed = train(sections(), tmp_path / "resumed", resume=True, quiet=True)
    assert max_difference(resumed.model.get_weights(), whole.model.get_weights()) == 0.0


def test_streamed_sub_batches_draw_the_masks_of_the_whole_batch() -> None:
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(10, 6)), tf.float32)
    y = tf.constant(rng.integers(3, size=10), tf.int32)
    weights = []
    for streamed in (False, True):
        keras.utils.set_random_seed(2)
        inputs = keras.Input((6,))
        hidden = keras.layers.Dropout(0.5)(keras.layers.Dense(16)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        seeds = SubBatchSeeds(model, optimizer.iterations)
        feed = Feed.SUB_BATCH if streamed else Feed.BATCH
        step = make_train_step(model, sparse_categorical_crossentropy, optimizer, 3, seeds=seeds, feed=feed)
        for _ in range(2):
            if streamed:
                # The sub-batches of 10 in 3: 3, 3, 4.
                step.train_batch([(x[start:end], y[start:end]) for start, end in ((0, 3), (3, 6), (6, 10))], 10)
            else:
                step.train_batch([(x, y)], 10)
        weights.append(model.get_weights())
    assert max_difference(weights[0], weights[1]) < 1e-6
