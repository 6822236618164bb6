"""``data.augment``: Keras image preprocessing layers, applied per sample in the feeder, training only.

Each sample's draw is a stateless seed folded from the seed, the epoch and the sample's index alone, so subdivided,
plain and resumed training see the same samples. Validation applies the layers in inference mode, where a layer
that changes the size is followed by a centre crop: Keras' own ``RandomCrop`` would pass the image whole.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from accumrun.data.section import AugmentConfig
from accumrun.errors import ConfigError
from accumrun.lookup import checked_keywords, find, normalized

# Layers that mix samples with each other (and their labels) cannot be drawn one sample at a time.
_BATCH_ONLY = {"mixup", "cutmix"}


class _SampleSeed(keras.random.SeedGenerator):
    """A stateless ``SeedGenerator`` for Keras' image layers: the n-th draw is ``seed`` folded with n, so draws
    depend on the sample's seed alone, and successive ones differ (a crop's row and column offsets are two)."""

    def __init__(self, seed: tf.Tensor) -> None:  # no variable: nothing here is state
        self._sample_seed = seed
        self._draws = 0

    def next(self, ordered: bool = True) -> tf.Tensor:
        self._draws += 1
        return tf.random.experimental.stateless_fold_in(self._sample_seed, self._draws)


class Augmentation:
    """The configured layers, applied one sample at a time."""

    def __init__(self, entries: list[AugmentConfig], sample_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Build the layers and check that they take samples of ``sample_shape``.

        Raises:
            ConfigError: an unknown layer or keyword, a sample that is not an image, or an image too small for it.
        """
        if len(sample_shape) != 3:
            raise ConfigError("data.augment", "image layers need image samples (height, width, channels)", sample_shape)
        # The layers that transform one image with a random draw, by normalized name.
        known = {
            normalized(name): cls
            for name, cls in vars(keras.layers).items()
            if isinstance(cls, type)
            and hasattr(cls, "get_random_transformation")
            and hasattr(cls, "transform_images")
            and normalized(name) not in _BATCH_ONLY
        }
        # Each layer, and the centre crop that follows it in inference mode where it changes the size.
        self._layers: list[tuple[Any, keras.layers.CenterCrop | None]] = []
        shape: tuple[int, ...] = sample_shape
        for position, entry in enumerate(entries):
            path = f"data.augment[{position}]"
            cls = find(known, entry.name, f"{path}.name", "augmentation layer")
            keywords = checked_keywords(cls, entry.keywords, path, cls.__name__)
            try:
                layer = cls(**keywords)
            except (TypeError, ValueError) as error:
                raise ConfigError(path, f"{cls.__name__}: {error}", entry.name) from None
            trained = _output_shape(layer, shape, path, entry.name)
            self._layers.append((layer, keras.layers.CenterCrop(*trained[:2]) if trained != shape else None))
            shape = trained
        self.dtype = tf.as_dtype(dtype)
        self.output_shape: tuple[int, ...] = shape
        """A sample's shape after the layers, which the model takes."""

    def __call__(self, x: tf.Tensor, index: tf.Tensor, seed: int, epoch: int, training: bool) -> tf.Tensor:
        """Sample ``x`` (number ``index``) augmented as drawn for ``(seed, epoch, index)``, in the stored dtype."""
        sample_seed = tf.random.experimental.stateless_fold_in(tf.constant([seed, epoch], tf.int64), index)
        image = x[tf.newaxis]  # a batch of one: some layers take batches only; the draws are the sample's own
        for position, (layer, centre_crop) in enumerate(self._layers):
            layer_seed = _SampleSeed(tf.random.experimental.stateless_fold_in(sample_seed, position))
            transformation = layer.get_random_transformation(image, training=training, seed=layer_seed)
            image = layer.transform_images(image, transformation, training=training)
            if not training and centre_crop is not None:
                image = centre_crop(image)
        if self.dtype.is_integer:
            return tf.cast(tf.clip_by_value(tf.round(image[0]), self.dtype.min, self.dtype.max), self.dtype)
        return tf.cast(image[0], self.dtype)


def _output_shape(layer: Any, shape: tuple[int, ...], path: str, name: str) -> tuple[int, ...]:
    """The shape ``layer`` turns samples of ``shape`` into; a ConfigError where the image is smaller than a crop,
    or the layer refuses the shape or ignores its seed."""
    height, width = shape[0], shape[1]
    wanted = (getattr(layer, "height", None), getattr(layer, "width", None))
    if isinstance(wanted[0], int) and isinstance(wanted[1], int) and (wanted[0] > height or wanted[1] > width):
        raise ConfigError(
            path,
            f"{type(layer).__name__} takes {wanted[0]}x{wanted[1]} crops of {height}x{width} images; the images are "
            "too small (lower it, or raise data.image_size)",
            name,
        )
    image = tf.random.stateless_uniform((1, *shape), seed=[1, 2], maxval=255.0)

    def draw() -> tf.Tensor:
        seed = _SampleSeed(tf.constant([3, 4], tf.int64))
        return layer.transform_images(image, layer.get_random_transformation(image, training=True, seed=seed))

    try:
        first, second = draw(), draw()
    except (ValueError, TypeError, tf.errors.OpError) as error:
        reason = str(getattr(error, "message", error)).strip().splitlines()[-1]
        raise ConfigError(path, f"{type(layer).__name__} refused samples of shape {shape}: {reason}", name) from None
    if not bool(tf.reduce_all(tf.equal(first, second))):
        raise ConfigError(
            path,
            f"{type(layer).__name__} ignores the seed it is given, so its draws would differ from run to run; "
            "use another layer",
            name,
        )
    return tuple(int(d) for d in first.shape[1:])
