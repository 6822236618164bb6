"""Models from the config: the built-ins, ``keras.applications``, saved Keras models and user factories."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import keras

from accumrun.config.schema import (
    ApplicationConfig,
    CustomModelConfig,
    DarknetCnnConfig,
    KerasHubConfig,
    MlpConfig,
    SavedModelConfig,
    TransformerConfig,
)
from accumrun.errors import ConfigError, DataError
from accumrun.lookup import checked_keywords, find, import_function, normalized, with_flags_read
from accumrun.models.hub import keras_hub_model
from accumrun.models.transformer import transformer


def build_model(
    config: Any,
    sample_shape: tuple[int, ...],
    outputs: int,
    vocabulary_size: int | None = None,
    *,
    per_position: bool = False,
    any_length: bool = False,
) -> keras.Model:
    """Build the configured model for samples of ``sample_shape`` and ``outputs`` outputs: one per class or
    label, or one per target value; ``vocabulary_size`` is a text source's, for models of token ids, and
    ``per_position`` asks for ``outputs`` at every position of a sequence (a language model, causally masked), and
    ``any_length`` for a model of token ids that takes sequences of any length (bucketed padding). The built-ins and
    new heads output logits.

    Raises:
        DataError: the samples do not fit the model (for example flat vectors into a CNN).
        ConfigError: a model cannot be found, built or loaded as configured (see each builder).
    """
    if isinstance(config, DarknetCnnConfig):
        return darknet_cnn(sample_shape, outputs, config.filters, config.strides, config.leaky_alpha)
    if isinstance(config, MlpConfig):
        return mlp(sample_shape, outputs, config.hidden, config.activation, config.dropout, config.l2)
    if isinstance(config, TransformerConfig):
        return transformer(
            sample_shape,
            outputs,
            vocabulary_size,
            layers=config.layers,
            heads=config.heads,
            width=config.width,
            dropout=config.dropout,
            causal=per_position,
            any_length=any_length,
            attention_bias=config.attention_bias,
        )
    if isinstance(config, ApplicationConfig):
        return application(config, sample_shape, outputs)
    if isinstance(config, KerasHubConfig):
        return keras_hub_model(
            config, sample_shape, outputs, vocabulary_size, per_position=per_position, any_length=any_length
        )
    if isinstance(config, SavedModelConfig):
        return saved_model(config, sample_shape)
    if isinstance(config, CustomModelConfig):
        return _custom_model(config, sample_shape, outputs)
    raise ConfigError("model.name", "unknown model", getattr(config, "name", config))


def darknet_cnn(
    sample_shape: tuple[int, ...],
    outputs: int,
    filters: list[int],
    strides: list[int],
    leaky_alpha: float = 0.1,
) -> keras.Model:
    """The network of the original subdivisions experiment.

    Blocks of 3x3 Conv2D (no bias: BatchNorm's offset replaces it) + BatchNorm + leaky ReLU, then global mean
    pooling and a Dense layer with ``outputs`` logits.
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
    logits = keras.layers.Dense(outputs, dtype="float32")(x)
    return keras.Model(inputs, logits, name="darknet_cnn")


def mlp(
    sample_shape: tuple[int, ...],
    outputs: int,
    hidden: list[int],
    activation: str = "relu",
    dropout: float = 0.0,
    l2: float = 0.0,
) -> keras.Model:
    """A multilayer perceptron on the flattened samples, with optional dropout after each hidden layer, and with
    ``l2`` times the sum of the squares of every kernel (not the biases) added to the loss (Keras' ``L2``)."""
    inputs = keras.Input(shape=sample_shape)
    x = keras.layers.Flatten()(inputs)
    regularizer = keras.regularizers.L2(l2) if l2 else None
    for width in hidden:
        try:
            x = keras.layers.Dense(width, activation=activation, kernel_regularizer=regularizer)(x)
        except ValueError as error:
            raise ConfigError("model.activation", f"unknown activation: {error}", activation) from None
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    logits = keras.layers.Dense(outputs, dtype="float32", kernel_regularizer=regularizer)(x)
    return keras.Model(inputs, logits, name="mlp")


def _custom_model(config: CustomModelConfig, sample_shape: tuple[int, ...], outputs: int) -> keras.Model:
    function = import_function(config.name, "model.name")
    try:
        model = function(
            input_shape=sample_shape, classes=outputs, **with_flags_read(function, config.model_extra or {})
        )
    except TypeError as error:
        raise ConfigError("model", f"{config.name} rejected its arguments: {error}") from None
    if not isinstance(model, keras.Model):
        raise ConfigError("model.name", "the function must return a keras.Model", type(model).__name__)
    return model


def application(config: ApplicationConfig, sample_shape: tuple[int, ...], outputs: int) -> keras.Model:
    """A ``keras.applications`` model for samples of ``sample_shape``.

    Without ``include_top`` (the default) the base ends in ``pooling`` and gets a new head of ``outputs``
    logits; ``freeze_base`` then trains the head alone. With ``include_top`` the application keeps its own
    classifier (sized to ``outputs`` unless ``classes`` is given; a sigmoid for one unit), whose softmax or
    sigmoid the loss then detects.

    Raises:
        ConfigError: an unknown application, an input shape it rejects (its message names the minimum), weights
            that cannot be loaded, or a keyword it does not take.
    """
    constructors = {normalized(name): value for name, value in vars(keras.applications).items() if callable(value)}
    constructor = find(constructors, config.constructor, "model.name", "keras application")
    keywords = config.keywords
    keywords = checked_keywords(constructor, keywords, "model", config.name)
    weights_file = config.weights if config.weights not in (None, "imagenet") else None
    if weights_file is not None and not Path(weights_file).is_file():
        raise ConfigError("model.weights", "weights file not found", weights_file)
    if config.include_top:
        keywords.setdefault("classes", outputs)
        if keywords["classes"] == 1 and "classifier_activation" in inspect.signature(constructor).parameters:
            # A softmax over one unit is always 1: a binary task's one unit is the sigmoid's probability.
            keywords.setdefault("classifier_activation", "sigmoid")
    else:
        keywords["pooling"] = config.pooling
    try:
        with warnings.catch_warnings():
            # Keras warns that an input size it has no weights for gets its default size's (224x224) weights;
            # the startup summary states the input shape, and the README says which weights load.
            warnings.filterwarnings("ignore", message=".*input_shape. is undefined or non-square", category=UserWarning)
            base = constructor(
                input_shape=sample_shape,
                include_top=config.include_top,
                weights="imagenet" if config.weights == "imagenet" else None,
                **keywords,
            )
        if weights_file is not None:
            base.load_weights(weights_file)
    except (ValueError, OSError) as error:
        message = " ".join(str(error).split())
        raise ConfigError("model", f"{config.constructor} refused input shape {sample_shape}: {message}") from None
    except Exception as error:
        # Keras' get_file raises a bare Exception("URL fetch failure on ...") when it cannot download.
        if config.weights != "imagenet" or "fetch failure" not in str(error):
            raise
        raise ConfigError(
            "model.weights",
            "could not download the imagenet weights (no network?); use weights: null to train from scratch, "
            "or the path of a weights file you have",
            config.weights,
        ) from None
    if config.include_top:
        return base
    if config.freeze_base:
        # Frozen layers also run in inference mode (BatchNorm uses its moving statistics), as Keras fine-tuning does.
        base.trainable = False
    # Logits stay float32 under a mixed-precision policy, so the softmax and the loss do too.
    head = keras.layers.Dense(outputs, dtype="float32", name="head")(base.output)
    return keras.Model(base.input, head, name=f"{base.name}_head")


def saved_model(config: SavedModelConfig, sample_shape: tuple[int, ...]) -> keras.Model:
    """A model a user saved with Keras, to train as it is; its input must take samples of ``sample_shape``.

    Raises:
        ConfigError: the file is missing, is not a Keras model, or takes inputs of another shape.
    """
    path = Path(config.path)
    if not path.is_file():
        raise ConfigError("model.path", "saved model not found", config.path)
    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as error:  # a file of any kind, or a model whose custom layers are not importable
        message = " ".join(str(error).split())[:300]
        raise ConfigError("model.path", f"cannot load as a Keras model: {message}", config.path) from None
    if not isinstance(model, keras.Model):
        raise ConfigError("model.path", "does not hold a Keras model", config.path)
    expected = model.input_shape
    fits = (
        not isinstance(expected, list)
        and len(expected) == len(sample_shape) + 1
        and all(e in (None, s) for e, s in zip(expected[1:], sample_shape, strict=True))
    )
    if not fits:
        raise ConfigError(
            "model.path",
            f"the model takes inputs of shape {_shape(expected)}, the data's samples have shape {sample_shape}",
            config.path,
        )
    return model


def _shape(shape: Any) -> Any:
    """A Keras input shape without its batch axis, as a user would write it."""
    return tuple(shape[1:]) if isinstance(shape, tuple) else shape
