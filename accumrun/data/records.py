"""``data.name: tfrecord``: TFRecord files of ``tf.train.Example``, each an encoded image and an int64 label (and
with ``data.weight``, a float weight), under ImageNet-style keys that can be renamed. At startup one pass counts
the records and reads their labels and weights (no image is decoded); the images stream when training reads them.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from accumrun.data.files import decode_image
from accumrun.data.section import FileSourceConfig, ImageSourceConfig, SampleWeights
from accumrun.data.source import AUTOTUNE, EncodedImages, taken
from accumrun.data.splits import Splits, checked_weights
from accumrun.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

    from accumrun.data.grouping import LengthGroups


class TfrecordConfig(SampleWeights, FileSourceConfig, ImageSourceConfig):
    """``name: tfrecord``: ``tf.train.Example`` records of an encoded image and an int64 label."""

    needs = {**ImageSourceConfig.needs, "path": "a TFRecord file or a glob of them"}
    name: Literal["tfrecord"]
    image_key: str = "image/encoded"
    label_key: str = "image/class/label"
    shuffle_buffer: int = Field(10_000, ge=1)
    """The seeded shuffle buffer after the per-epoch permutation of the files."""


@dataclass(frozen=True)
class RecordLayout:
    """Which features of a record hold the image and the label, and how the images are decoded and shuffled."""

    image_key: str
    label_key: str
    image_size: tuple[int, int]
    channels: int
    shuffle_buffer: int
    weight_key: str | None = None


@dataclass(frozen=True, eq=False)
class RecordFiles(EncodedImages):
    """TFRecord files of ``tf.train.Example``, their records numbered across the files in their sorted order:
    ``records`` is the numbers this split holds, ``y`` their labels. TFRecord files cannot be read out of order, so an
    epoch reads a seeded permutation of the files through a seeded shuffle buffer, filtered by record number."""

    files: tuple[str, ...]
    counts: tuple[int, ...]
    """Records per file."""
    records: np.ndarray
    y: np.ndarray
    image_key: str
    label_key: str
    image_size: tuple[int, int]
    channels: int
    shuffle_buffer: int
    w: np.ndarray | None = None

    labelled_files = True
    indexed = False

    @property
    def indices(self) -> np.ndarray:
        return self.records

    keys = indices  # a record's number names it for data.cache too

    def cache_identity(self) -> tuple[dict[str, Any], list[str]]:
        settings = {"source": "tfrecord", "image_size": list(self.image_size), "channels": self.channels}
        return {**settings, "image_key": self.image_key}, list(self.files)

    def subset(self, index: np.ndarray) -> RecordFiles:
        chosen = np.sort(index)
        return replace(self, records=self.records[chosen], y=self.y[chosen], w=taken(self.w, chosen))

    @cached_property
    def _offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @cached_property
    def _lookups(self) -> tuple[tf.Tensor, tf.Tensor | None]:
        """Whether each record number is held, and its weight (by record number, as the stream numbers them)."""
        import tensorflow as tf

        held = np.zeros(sum(self.counts), dtype=bool)
        held[self.records] = True
        weights = None
        if self.w is not None:
            weights = np.zeros(len(held), np.float32)
            weights[self.records] = self.w
            weights = tf.constant(weights)
        return tf.constant(held), weights

    def order(self, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
        """The record numbers in the epoch's order, from the counts alone: no file is read."""
        numbered = self._numbered(epoch, seed, shuffle, read=False).map(lambda index, _: index)
        return np.concatenate([np.zeros(0, np.int64), *numbered.batch(1 << 16).as_numpy_iterator()])

    def stream(
        self, epoch: int, seed: int, shuffle: bool, skip: int = 0, groups: LengthGroups | None = None
    ) -> tf.data.Dataset:
        """The epoch's records as ``(record number, image, y)``, decoded in parallel, after the first ``skip``.

        Raises:
            ValueError: ``groups``: records are read in their files' order, not by index.
        """
        if groups is not None:
            raise ValueError("TFRecord files are read in their own order: they cannot be grouped by length")
        return self._decoded(self._raw_stream(epoch, seed, shuffle, skip))

    def read(self, order: np.ndarray) -> tf.data.Dataset:
        raise ValueError("TFRecord files are read in their own order, not by index")

    def _raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        import tensorflow as tf

        from accumrun.core.targets import as_targets

        weights = self._lookups[1]  # made here, eagerly: not inside the function that the map traces

        def label_of(index: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
            # Every record's label was read at startup, so this cannot fail; the image is parsed with the decode.
            label = tf.io.parse_single_example(record, {self.label_key: tf.io.FixedLenFeature([], tf.int64)})
            weight = None if weights is None else tf.gather(weights, index)
            return index, record, as_targets(tf.cast(label[self.label_key], tf.int32), weight)

        numbered = self._numbered(epoch, seed, shuffle, read=True)
        return numbered.skip(skip).map(label_of, num_parallel_calls=AUTOTUNE, deterministic=True)

    def _numbered(self, epoch: int, seed: int, shuffle: bool, read: bool) -> tf.data.Dataset:
        """``(record number, record)`` for the epoch, or ``(number, number)`` unless ``read``: a shuffle buffer's
        order depends on its seed and the count of elements, not on what they hold, so both come in the same order."""
        import tensorflow as tf

        def per_file(name: tf.Tensor, offset: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
            if read:
                return tf.data.TFRecordDataset(name).enumerate().map(lambda i, r: (offset + i, r))
            return tf.data.Dataset.range(offset, offset + count).map(lambda i: (i, i))

        files = np.arange(len(self.files))
        if shuffle:
            files = np.random.default_rng([seed, epoch]).permutation(files)
        names = tf.constant(np.array(self.files)[files])
        offsets = tf.constant(self._offsets[files])
        counts = tf.constant(np.array(self.counts, dtype=np.int64)[files])
        records = tf.data.Dataset.from_tensor_slices((names, offsets, counts)).flat_map(per_file)
        if self.size != sum(self.counts):  # one side of the hold-out: filter the other out
            held = self._lookups[0]
            records = records.filter(lambda index, _: held[index])
        if shuffle:
            # One seed per epoch, from the run's seed: the same records in the same order, run after run.
            epoch_seed = int(np.random.default_rng([seed, epoch, 1]).integers(2**31))
            records = records.shuffle(self.shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
        return records

    def _decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the record: its image is parsed (a record without it fails here) and decoded."""
        import tensorflow as tf

        image = tf.io.parse_single_example(raw, {self.image_key: tf.io.FixedLenFeature([], tf.string)})
        return decode_image(image[self.image_key], self.image_size, self.channels)

    def describe(self, index: int) -> str:
        file = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return f"{self.files[file]}, record {index - int(self._offsets[file])}"


def load_tfrecord(config: TfrecordConfig, seed: int) -> Splits:
    """The records under ``data.path`` (a file or a glob), and ``data.validation_path`` when it is set.

    Raises:
        DataError: no file matches, a file is not TFRecord, or a record lacks the image or label key.
    """
    layout = RecordLayout(
        config.image_key, config.label_key, config.size, config.channels, config.shuffle_buffer, config.weight
    )

    def read(pattern: str, key: str) -> RecordFiles:
        return read_record_files(matching(pattern, key), key, layout)

    train = read(config.path, "data.path")
    return Splits(train, read(config.validation_path, "data.validation_path") if config.validation_path else None)


def matching(pattern: str, key: str) -> list[str]:
    """The files that ``pattern`` (a path or a glob) names, sorted. A path that is no file names its shards,
    ``<path>-00000-of-00002`` and the rest, as ``accumrun make-example tfrecord`` and most writers name them.

    Raises:
        DataError: none.
    """
    names = pattern
    if not glob.has_magic(pattern) and not Path(pattern).is_file():
        names = f"{glob.escape(pattern)}-[0-9]*-of-[0-9]*"
    files = sorted(file for file in glob.glob(names) if Path(file).is_file())
    if not files:
        raise DataError(key, "no TFRecord file matches", pattern)
    return files


def read_record_files(files: list[str], key: str, layout: RecordLayout) -> RecordFiles:
    """Count the records of ``files`` and read their labels (and weights, with ``layout.weight_key``).

    Raises:
        DataError: a file is not TFRecord, or its records lack the image, label or weight key, or a weight is
            negative, NaN or Inf.
    """
    import tensorflow as tf

    labels, weights = [], []
    features = {layout.label_key: tf.io.FixedLenFeature([], tf.int64)}
    if layout.weight_key is not None:
        features[layout.weight_key] = tf.io.FixedLenFeature([], tf.float32)
    for file in files:
        _check_keys(file, key, layout)
        parsed = tf.data.TFRecordDataset(file).batch(4096).map(lambda r: tf.io.parse_example(r, features))
        try:
            batches = list(parsed.as_numpy_iterator())
        except tf.errors.OpError as error:
            raise DataError(key, f"{file}: cannot read its records: {first_line(error)}") from None
        columns = {name: np.concatenate([b[name] for b in batches] or [np.zeros(0, np.int64)]) for name in features}
        labels.append(columns[layout.label_key])
        if layout.weight_key is not None:
            where = f"{file}, feature {layout.weight_key!r}"
            weights.append(checked_weights(columns[layout.weight_key], where, len(labels[-1])))
    y = np.concatenate(labels)
    if len(y) == 0:
        raise DataError(key, "the TFRecord files hold no records", files[0] if len(files) == 1 else files)
    w = np.concatenate(weights) if layout.weight_key is not None else None
    image = (layout.image_key, layout.label_key, layout.image_size, layout.channels, layout.shuffle_buffer)
    counts = tuple(len(found) for found in labels)
    return RecordFiles(tuple(files), counts, np.arange(len(y)), y, *image, w)


def _check_keys(file: str, key: str, layout: RecordLayout) -> None:
    """Refuse a file whose first record lacks the image or the label key, naming the keys it has."""
    import tensorflow as tf

    try:
        first = next(iter(tf.data.TFRecordDataset(file).take(1)), None)
    except tf.errors.OpError as error:
        raise DataError(key, f"{file} is not a TFRecord file: {first_line(error)}") from None
    if first is None:
        return
    try:
        example = tf.train.Example.FromString(first.numpy())
    except Exception:  # protobuf's DecodeError: the record is not a tf.train.Example
        raise DataError(key, f"{file}: its records are not tf.train.Example protos") from None
    present = sorted(example.features.feature)
    keys = [(layout.image_key, "data.image_key", "bytes_list"), (layout.label_key, "data.label_key", "int64_list")]
    if layout.weight_key is not None:
        keys.append((layout.weight_key, "data.weight", "float_list"))
    for name, field, kind in keys:
        if name not in present:
            raise DataError(field, f"{file} has no feature '{name}'; its features are {present}", name)
        if example.features.feature[name].WhichOneof("kind") != kind:
            raise DataError(field, f"{file}: feature '{name}' must be a {kind}", name)


def first_line(error: Exception) -> str:
    """The first line of an error's message, or its type's name where it has none."""
    lines = (getattr(error, "message", None) or str(error)).strip().splitlines()
    return lines[0] if lines else type(error).__name__
