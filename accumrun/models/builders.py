"""The model registry: config -> ``keras.Model`` that maps samples to one logit per class."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import keras

from accumrun.config.schema import CustomModelConfig, DarknetCnnConfig, MlpConfig
from accumrun.errors import ConfigError, DataError


def build_model(config: Any, sample_shape: tuple[int, ...], classes: int) -> keras.Model:
    """Build the configured model for samples of ``sample_shape`` and ``classes`` outputs (logits).

    Raises:
        DataError: the samples do not fit the model (for example flat vectors into a CNN).
        ConfigError: a custom model cannot be imported, fails, or does not return a Keras model.
    """
    if isinstance(config, DarknetCnnConfig):
        return darknet_cnn(sample_shape, classes, config.filters, config.strides, config.leaky_alpha)
    if isinstance(config, MlpConfig):
        return mlp(sample_shape, classes, config.hidden, config.activation, config.dropout)
    if isinstance(config, CustomModelConfig):
        return _custom_model(config, sample_shape, classes)
    raise ConfigError("model.name", "unknown model", getattr(config, "name", config))


def darknet_cnn(
    sample_shape: tuple[int, ...],
    classes: int,
    filters: list[int],
    strides: list[int],
    leaky_alpha: float = 0.1,
) -> keras.Model:
    """The network of the original subdivisions experiment.

    Blocks of 3x3 Conv2D (no bias: BatchNorm's offset replaces it) + BatchNorm + leaky ReLU, then global mean
    pooling and a Dense layer with one logit per class.
    """
    if len(sample_shape) != 3:
        raise DataError(
            "data", "darknet_cnn needs image samples of shape (height, width, channels)", tuple(sample_shape)
        )
    inputs = keras.Input(shape=sample_shape)
    x = inputs
    for width, stride in zip(filters, strides, strict=True):
        x = keras.layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.LeakyReLU(negative_slope=leaky_alpha)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    # Logits stay float32 under a mixed-precision policy, so the softmax and the loss do too.
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="darknet_cnn")


def mlp(
    sample_shape: tuple[int, ...],
    classes: int,
    hidden: list[int],
    activation: str = "relu",
    dropout: float = 0.0,
) -> keras.Model:
    """A multilayer perceptron on the flattened samples, with optional dropout after each hidden layer."""
    inputs = keras.Input(shape=sample_shape)
    x = keras.layers.Flatten()(inputs)
    for width in hidden:
        try:
            x = keras.layers.Dense(width, activation=activation)(x)
        except ValueError as error:
            raise ConfigError("model.activation", f"unknown activation: {error}", activation) from None
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="mlp")


def _custom_model(config: CustomModelConfig, sample_shape: tuple[int, ...], classes: int) -> keras.Model:
    module_name, _, function_name = config.name.partition(":")
    # A console script does not put the working directory on sys.path; user models usually live there.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module may fail in any way while it is imported
        reason = f"{type(error).__name__}: {error}"
        raise ConfigError("model.name", f"cannot import module '{module_name}': {reason}", config.name) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError("model.name", f"module '{module_name}' has no function '{function_name}'", config.name)
    try:
        model = function(input_shape=sample_shape, classes=classes, **(config.model_extra or {}))
    except TypeError as error:
        raise ConfigError("model", f"{config.name} rejected its arguments: {error}") from None
    if not isinstance(model, keras.Model):
        raise ConfigError("model.name", "the function must return a keras.Model", type(model).__name__)
    return model
