"""Code a user would write and name in a config (``tests.user_code:NAME``): model factories and losses.

accumrun imports it from the working directory, the repository root under pytest.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def mlp(input_shape: tuple[int, ...], classes: int, hidden: list[int], head: str | None = None) -> keras.Model:
    """Dense layers, then ``classes`` outputs: logits, or probabilities through a final ``head`` activation layer
    (``softmax``, ``sigmoid``). The activation has no weights, so the same seed gives the same weights."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    for width in hidden:
        x = keras.layers.Dense(width, activation="tanh")(x)
    x = keras.layers.Dense(classes)(x)
    if head is not None:
        x = keras.layers.Activation(head)(x)
    return keras.Model(inputs, x)


def mean_squared_error_of_the_batch(targets: Any, predictions: Any) -> Any:
    """One value for the whole batch: what accumrun must refuse, since it cannot weight sub-batches by it."""
    return tf.reduce_mean(tf.square(targets - predictions))


def squared_error(targets: Any, predictions: Any, scale: float = 1.0) -> Any:
    """One value per sample, as accumrun needs; ``scale`` shows that config keywords reach it."""
    return scale * tf.reduce_sum(tf.square(targets - predictions), axis=-1)
