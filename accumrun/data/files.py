"""Sources of one file per sample, listed under their class labels: image files (``image_folder``) and text files
(``text_folder``), each read and decoded (tokenized) only when the epoch's order reaches it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from accumrun.data.source import EncodedImages, Source, TokenIds, taken
from accumrun.data.tokenizers import Tokenizer

if TYPE_CHECKING:
    import tensorflow as tf

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""The files an image folder reads, as ``keras.utils.image_dataset_from_directory`` does."""


def decode_image(raw: tf.Tensor, size: tuple[int, int], channels: int) -> tf.Tensor:
    """PNG, JPEG, BMP or GIF (its first frame) bytes to a uint8 image of ``size`` and ``channels``: decoded to RGB
    first (BMP and GIF have no grayscale decoding in TensorFlow), resized bilinearly as Keras does, rounded."""
    import tensorflow as tf

    image = tf.io.decode_image(raw, channels=3, expand_animations=False)
    if channels == 1:
        image = tf.image.rgb_to_grayscale(image)

    def resized() -> tf.Tensor:
        scaled = tf.image.resize(tf.cast(image, tf.float32), size)
        return tf.cast(tf.clip_by_value(tf.round(scaled), 0.0, 255.0), tf.uint8)

    # An image already of the size is kept as it is: resizing it would only cost time (a third of the decode).
    same = tf.reduce_all(tf.equal(tf.shape(image)[:2], size))
    return tf.ensure_shape(tf.cond(same, lambda: image, resized), (*size, channels))


@dataclass(frozen=True, eq=False)
class _LabelledFiles(Source):
    """Files and their class indices; ``raw`` is a file's path, read and decoded in one step of the pipeline."""

    paths: np.ndarray
    """The files, as an array of path strings (so that a subset is one indexing)."""
    y: np.ndarray
    w: np.ndarray | None = field(default=None, kw_only=True)

    labelled_files = True

    @property
    def keys(self) -> np.ndarray:
        return self.paths

    def subset(self, index: np.ndarray) -> Any:
        return replace(self, paths=self.paths[index], y=self.y[index], w=taken(self.w, index))

    def _raw(self, order: np.ndarray) -> tf.data.Dataset:
        import tensorflow as tf

        from accumrun.core.targets import as_targets

        targets = as_targets(self.y[order], taken(self.w, order))
        return tf.data.Dataset.from_tensor_slices((order.astype(np.int64), self.paths[order], targets))

    def describe(self, index: int) -> str:
        return str(self.paths[index])


@dataclass(frozen=True, eq=False)
class ImageFiles(_LabelledFiles, EncodedImages):
    """Image files and their class indices; each is decoded and resized to ``image_size`` when it is read."""

    image_size: tuple[int, int]
    channels: int

    def cache_identity(self) -> tuple[dict[str, Any], list[str]]:
        settings = {"source": "image files", "image_size": list(self.image_size), "channels": self.channels}
        # Sorted: the key names the files, whichever side of the hold-out listed them in which order.
        return settings, sorted(str(path) for path in self.paths)

    def _decode(self, raw: tf.Tensor) -> tf.Tensor:
        import tensorflow as tf

        return decode_image(tf.io.read_file(raw), self.image_size, self.channels)


@dataclass(frozen=True, eq=False)
class TextFiles(_LabelledFiles, TokenIds):
    """UTF-8 text files and their class indices; each is read and tokenized to ``length`` int32 token ids (cut, or
    padded with 0) by the tokenizer's TensorFlow ops (the same ids as its host ``encode``) when it is read."""

    tokenizer: Tokenizer
    length: int

    def _decode(self, raw: tf.Tensor) -> tf.Tensor:
        import tensorflow as tf

        text = tf.reshape(tf.io.read_file(raw), [1])
        ids = self.tokenizer.encode_tensor(text, self.length)
        return tf.ensure_shape(tf.reshape(ids, [self.length]), (self.length,))
