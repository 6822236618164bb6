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


def noisy_attention(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    """Every random layer accumrun draws per sample: spatial dropout and Gaussian noise on a 4x4 image, attention
    with dropout over its 16 pixels, Gaussian and alpha dropout, then plain dropout before the logits."""
    inputs = keras.Input(input_shape)
    x = keras.layers.GaussianNoise(0.3)(keras.layers.SpatialDropout2D(0.3)(inputs))
    x = keras.layers.Dense(8)(keras.layers.Reshape((-1, input_shape[-1]))(x))
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.2)(x, x)
    x = keras.layers.AlphaDropout(0.2)(keras.layers.GaussianDropout(0.2)(x))
    x = keras.layers.Dropout(0.5)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, keras.layers.Dense(classes)(x))


class OwnNoise(keras.layers.Layer):
    """A layer that draws from a SeedGenerator of its own: randomness accumrun does not know."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(7)

    def call(self, inputs: Any, training: bool = False) -> Any:
        if not training:
            return inputs
        return inputs + keras.random.normal(keras.ops.shape(inputs), seed=self.seed_generator)


def own_noise_mlp(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    """A Dropout (known) and an :class:`OwnNoise` (unknown) before the logits."""
    inputs = keras.Input(input_shape)
    x = OwnNoise()(keras.layers.Dropout(0.2)(keras.layers.Dense(8)(inputs)))
    return keras.Model(inputs, keras.layers.Dense(classes)(x))
