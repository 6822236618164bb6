"""``model.name: mlp``: a multilayer perceptron on the flattened samples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import Field

from accumrun.errors import ConfigError
from accumrun.models.dtypes import logits_dtype
from accumrun.models.kind import BuildRequest, ModelSection
from accumrun.sections import Section

if TYPE_CHECKING:
    import keras


class MlpConfig(ModelSection, Section):
    name: Literal["mlp"]
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    dropout: float = Field(0.0, ge=0, lt=1)
    l2: float = Field(0.0, ge=0)
    """Keras' ``L2`` on every kernel: this factor times the sum of their squares is added to the loss (with the
    mean loss and no hold-out, scikit-learn's ``C`` is ``l2 = 1 / (2 C N)``)."""


def build(config: MlpConfig, request: BuildRequest) -> keras.Model:
    """The perceptron ``config`` describes, for the samples and outputs of ``request``."""
    return mlp(request.sample_shape, request.outputs, config.hidden, config.activation, config.dropout, config.l2)


def mlp(
    sample_shape: tuple[int, ...],
    outputs: int,
    hidden: list[int],
    activation: str = "relu",
    dropout: float = 0.0,
    l2: float = 0.0,
) -> keras.Model:
    """A multilayer perceptron on the flattened samples, with optional dropout after each hidden layer, and with
    ``l2`` times the sum of the squares of every kernel (not the biases) added to the loss (Keras' ``L2``).

    Raises:
        ConfigError: an activation Keras does not know.
    """
    import keras

    inputs = keras.Input(shape=sample_shape)
    x = keras.layers.Flatten()(inputs)
    regularizer = keras.regularizers.L2(l2) if l2 else None
    if regularizer is not None:
        # Keras keeps the factor as a Python float, which it casts to a kernel's dtype through float32: a float64
        # kernel would get a rounded factor. A float64 number is cast from itself (to float32 as before).
        regularizer.l2 = np.float64(l2)
    for width in hidden:
        try:
            x = keras.layers.Dense(width, activation=activation, kernel_regularizer=regularizer)(x)
        except ValueError as error:
            raise ConfigError("model.activation", f"unknown activation: {error}", activation) from None
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    logits = keras.layers.Dense(outputs, dtype=logits_dtype(), kernel_regularizer=regularizer)(x)
    return keras.Model(inputs, logits, name="mlp")
