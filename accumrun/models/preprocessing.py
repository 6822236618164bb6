"""The model's input layers: raw samples in, as the source stores them, cast and scaled inside the model.

Samples cross to the device in their stored dtype (uint8 images: one byte per value). The step slices the
batch into sub-batches there and calls the model on each, so these layers cast and scale one sub-batch at a
time: only the sub-batch ever costs four bytes per value. The trained model keeps them, so it takes raw
samples wherever it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from accumrun.data.section import NormalizeConfig
from accumrun.errors import ConfigError

Preprocess = Callable[[Any], Any]


def with_input_preprocessing(
    model: keras.Model,
    input_shape: tuple[int, ...],
    dtype: np.dtype,
    scale: float,
    normalize: NormalizeConfig | None,
    preprocess: Preprocess | None = None,
) -> keras.Model:
    """``model`` behind a raw input of ``dtype``: ``x * scale``, then ``(x - mean) / std`` per channel, then
    ``preprocess`` (a pretrained application's own ``preprocess_input``, on values of 0..255).

    float32 samples with nothing to scale are given to ``model`` as they are, and so is a model whose input is
    not floating point: it takes raw samples and scales them itself (a ``model.keras`` that accumrun saved).

    Raises:
        ConfigError: ``normalize`` has neither one value nor one per channel.
    """
    if dtype == np.float32 and scale == 1.0 and normalize is None and preprocess is None:
        return model
    if model.inputs and not np.issubdtype(np.dtype(model.inputs[0].dtype), np.floating):
        return model
    inputs = keras.Input(shape=input_shape, dtype=np.dtype(dtype).name, name="raw_input")
    # Rescaling casts to the compute dtype first, so a uint8 input is cast here, per sub-batch.
    x = keras.layers.Rescaling(scale, name="rescale")(inputs)
    if normalize is not None:
        x = _normalization(normalize, input_shape[-1])(x)
    if preprocess is not None:
        # Keras ops on the symbolic input: they are saved with the model and load without accumrun.
        x = preprocess(x)
    return keras.Model(inputs, model(x), name=model.name)


def _normalization(normalize: NormalizeConfig, channels: int) -> keras.layers.Layer:
    mean, std = np.array(normalize.mean), np.array(normalize.std)
    for key, values in (("mean", mean), ("std", std)):
        if len(values) not in (1, channels):
            raise ConfigError(
                f"data.normalize.{key}", f"needs one value, or one per channel ({channels})", values.tolist()
            )
    if len(mean) == 1 and len(std) == 1:
        return keras.layers.Normalization(axis=None, mean=float(mean[0]), variance=float(std[0]) ** 2, name="normalize")
    mean = np.broadcast_to(mean, (channels,))
    std = np.broadcast_to(std, (channels,))
    return keras.layers.Normalization(axis=-1, mean=mean.tolist(), variance=(std**2).tolist(), name="normalize")


def at_stored_size(model: keras.Model, stored_shape: tuple[int, ...], dtype: np.dtype) -> keras.Model:
    """``model`` behind an input of the samples' stored shape, cropped at the centre to the size it trained at:
    what ``model.keras`` holds when augmentation changed the size, so that it takes images at ``image_size``,
    as validation did. ``model`` itself when the sizes agree, or when it takes any size (token ids of any
    length)."""
    trained = tuple(model.input_shape[1:])
    if trained == tuple(stored_shape) or None in trained:
        return model
    inputs = keras.Input(shape=stored_shape, dtype=np.dtype(dtype).name, name="image")
    cropped = keras.layers.CenterCrop(trained[0], trained[1], name="centre_crop")(inputs)
    return keras.Model(inputs, model(cropped), name=model.name)
