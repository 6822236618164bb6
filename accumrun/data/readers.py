"""Reading a split's samples with ``tf.data``, one epoch at a time, in an order fixed by the seed and the epoch.

Every reader gives the same thing: a stream of ``(index, x, y)``, where ``index`` numbers the sample within its
source (the draw of its augmentation depends on it) and ``x`` keeps the stored dtype (uint8 for images). Arrays
and image files are visited in :func:`~accumrun.data.splits.epoch_order`, a seeded permutation per epoch.
TFRecord files cannot be read out of order, so their order is a seeded permutation of the files, read one
after another, through a seeded shuffle buffer of ``data.shuffle_buffer`` records. Either way, ``skip`` passes
over the samples an interrupted epoch already trained on before anything is decoded.

Decoding runs in parallel (``num_parallel_calls=AUTOTUNE``) and keeps the order (``deterministic=True``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from accumrun.data.splits import ArraySplit, ImageFiles, RecordFiles, Split, epoch_order

AUTOTUNE = tf.data.AUTOTUNE


def decode_image(raw: tf.Tensor, size: tuple[int, int], channels: int) -> tf.Tensor:
    """PNG, JPEG, BMP or GIF (its first frame) bytes to a uint8 image of ``size`` and ``channels``.

    Every format decodes to RGB first (BMP and GIF have no grayscale decoding in TensorFlow), then to one
    channel when asked; resizing is bilinear, as Keras' image loading does, rounded back to uint8.
    """
    image = tf.io.decode_image(raw, channels=3, expand_animations=False)
    if channels == 1:
        image = tf.image.rgb_to_grayscale(image)

    def resized() -> tf.Tensor:
        scaled = tf.image.resize(tf.cast(image, tf.float32), size)
        return tf.cast(tf.clip_by_value(tf.round(scaled), 0.0, 255.0), tf.uint8)

    # An image already of the size is kept as it is: resizing it would only cost time (a third of the decode).
    same = tf.reduce_all(tf.equal(tf.shape(image)[:2], size))
    return tf.ensure_shape(tf.cond(same, lambda: image, resized), (*size, channels))


class Reader:
    """A split read as a stream of ``(index, raw, y)``, decoded by :meth:`decode` (``raw`` is whatever is cheap
    to pass along: a row index, a file's path, a record's bytes)."""

    size: int

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        """The epoch's samples, undecoded, after the first ``skip``."""
        raise NotImplementedError

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """One stored sample from what :meth:`raw_stream` gives."""
        return raw

    def describe(self, index: int) -> str:
        """Where sample ``index`` comes from, for an error message."""
        return f"sample {index}"

    def stream(self, epoch: int, seed: int, shuffle: bool, skip: int = 0) -> tf.data.Dataset:
        """The epoch's samples as ``(index, x, y)``, decoded in parallel, after the first ``skip``."""
        return self.raw_stream(epoch, seed, shuffle, skip).map(
            lambda index, raw, y: (index, self.decode(raw), y), num_parallel_calls=AUTOTUNE, deterministic=True
        )

    def find_undecodable(self, epoch: int, seed: int, shuffle: bool, skip: int, count: int) -> str | None:
        """The first of the ``count`` samples after ``skip`` in the epoch that does not decode, described; None
        if they all do (or the fault is not in decoding them)."""
        with contextlib.suppress(tf.errors.OpError):  # the stream itself failed: not a fault of one sample
            for index, raw, _ in self.raw_stream(epoch, seed, shuffle, skip).take(count):
                try:
                    self.decode(raw)
                except tf.errors.OpError:
                    return self.describe(int(index))
        return None


class ArrayReader(Reader):
    """Arrays in host memory (one copy, made once), gathered in the epoch's order."""

    def __init__(self, split: ArraySplit) -> None:
        self.size = split.size
        with tf.device("/CPU:0"):
            self.x = tf.constant(split.x)
            self.y = tf.constant(split.y)

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        order = epoch_order(self.size, seed, epoch, shuffle)[skip:]
        return tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).map(
            lambda i: (i, tf.gather(self.x, i), tf.gather(self.y, i)), num_parallel_calls=AUTOTUNE, deterministic=True
        )


class ImageReader(Reader):
    """Image files, read and decoded as the epoch's order reaches them."""

    def __init__(self, split: ImageFiles) -> None:
        self.size = split.size
        self.split = split

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        order = epoch_order(self.size, seed, epoch, shuffle)[skip:]
        paths, labels = self.split.paths[order], self.split.y[order]
        return tf.data.Dataset.from_tensor_slices((order.astype(np.int64), paths, labels))

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the file's path: reading and decoding are one step of the pipeline."""
        return decode_image(tf.io.read_file(raw), self.split.image_size, self.split.channels)

    def describe(self, index: int) -> str:
        return str(self.split.paths[index])


class RecordReader(Reader):
    """TFRecord files: the files in a seeded order per epoch, records numbered across the sorted files, a
    seeded shuffle buffer, and the hold-out (when the split is one side of it) filtered by record number."""

    def __init__(self, split: RecordFiles) -> None:
        self.size = split.size
        self.split = split
        self._offsets = np.concatenate([[0], np.cumsum(split.counts)[:-1]]).astype(np.int64)
        self._label = {split.label_key: tf.io.FixedLenFeature([], tf.int64)}
        self._image = {split.image_key: tf.io.FixedLenFeature([], tf.string)}
        held = np.zeros(sum(split.counts), dtype=bool)
        held[split.records] = True
        self._held = tf.constant(held)

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        split = self.split
        files = np.arange(len(split.files))
        if shuffle:
            files = np.random.default_rng([seed, epoch]).permutation(files)
        names = tf.constant(np.array(split.files)[files])
        offsets = tf.constant(self._offsets[files])
        records = tf.data.Dataset.from_tensor_slices((names, offsets)).flat_map(
            lambda name, offset: tf.data.TFRecordDataset(name).enumerate().map(lambda i, r: (offset + i, r))
        )
        if not split.complete:
            records = records.filter(lambda index, _: self._held[index])
        if shuffle:
            # One seed per epoch, from the run's seed: the same records in the same order, run after run.
            epoch_seed = int(np.random.default_rng([seed, epoch, 1]).integers(2**31))
            records = records.shuffle(split.shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
        return records.skip(skip).map(self._label_of, num_parallel_calls=AUTOTUNE, deterministic=True)

    def _label_of(self, index: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        # Every record's label was read at startup, so this cannot fail; the image is parsed with the decode.
        label = tf.io.parse_single_example(record, self._label)[self.split.label_key]
        return index, record, tf.cast(label, tf.int32)

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the record: its image is parsed (a record without it fails here) and decoded."""
        image = tf.io.parse_single_example(raw, self._image)[self.split.image_key]
        return decode_image(image, self.split.image_size, self.split.channels)

    def describe(self, index: int) -> str:
        file = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return f"{self.split.files[file]}, record {index - int(self._offsets[file])}"


def reader_for(split: Split) -> Reader:
    """The reader of a split of any kind."""
    if isinstance(split, ArraySplit):
        return ArrayReader(split)
    if isinstance(split, ImageFiles):
        return ImageReader(split)
    return RecordReader(split)
