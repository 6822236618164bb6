"""A model for the LoRA tests, by ``model: {name: "tests.lora_models:dense_norm"}`` or saved as a ``.keras`` file:
named Dense layers around a BatchNorm (which LoRA freezes) and a dropout (drawn per sample); and the adapters the tests
train."""

from __future__ import annotations

import keras

LORA = {"rank": 2, "alpha": 4.0}
"""The adapters the tests train: rank 2, scaled by alpha / rank = 2."""


def dense_norm(input_shape: tuple[int, ...], classes: int, hidden: int = 16) -> keras.Model:
    """``hidden`` -> BatchNorm -> ReLU -> dropout 0.3 -> ``head``, on the flattened input."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(hidden, name="hidden")(keras.layers.Flatten()(inputs))
    x = keras.layers.Dropout(0.3)(keras.layers.ReLU()(keras.layers.BatchNormalization(name="norm")(x)))
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(x))
