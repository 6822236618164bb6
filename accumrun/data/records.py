"""``data.name: tfrecord``: TFRecord files of ``tf.train.Example``, each an encoded image and an int64 label
(and with ``data.weight``, a float weight).

The keys follow common ImageNet-style TFRecords (``image/encoded``, ``image/class/label``) and can be renamed.
At startup one pass over the records counts them per file and reads their labels and weights (no image is
decoded), so that the batch plan and the classes are known; the images stream when training reads them.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accumrun.config.schema import TfrecordConfig
from accumrun.data.splits import RecordFiles, Splits
from accumrun.data.weights import checked_weights
from accumrun.errors import DataError

_LABEL_BATCH = 4096


@dataclass(frozen=True)
class RecordLayout:
    """Which features of a record hold the image and the label, and how the images are decoded and shuffled."""

    image_key: str
    label_key: str
    image_size: tuple[int, int]
    channels: int
    shuffle_buffer: int
    weight_key: str | None = None


def load_tfrecord(config: TfrecordConfig, seed: int) -> Splits:
    """The records under ``data.path`` (a file or a glob), and ``data.validation_path`` when it is set.

    Raises:
        DataError: no file matches, a file is not TFRecord, or a record lacks the image or label key.
    """
    layout = RecordLayout(
        config.image_key, config.label_key, config.size, config.channels, config.shuffle_buffer, config.weight
    )
    train = read_record_files(matching(config.path, "data.path"), "data.path", layout)
    test = None
    if config.validation_path:
        test = read_record_files(
            matching(config.validation_path, "data.validation_path"), "data.validation_path", layout
        )
    return Splits(train, test)


def matching(pattern: str, key: str) -> list[str]:
    """The files that ``pattern`` (a path or a glob) names, sorted. A path that is no file names its shards,
    ``<path>-00000-of-00002`` and the rest, as ``accumrun make-example tfrecord`` and most writers name them.

    Raises:
        DataError: none.
    """
    if glob.has_magic(pattern):
        files = sorted(glob.glob(pattern))
    elif Path(pattern).is_file():
        files = [pattern]
    else:
        files = sorted(glob.glob(f"{glob.escape(pattern)}-[0-9]*-of-[0-9]*"))
    files = [file for file in files if Path(file).is_file()]
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

    counts, labels, weights = [], [], []
    features = {layout.label_key: tf.io.FixedLenFeature([], tf.int64)}
    if layout.weight_key is not None:
        features[layout.weight_key] = tf.io.FixedLenFeature([], tf.float32)
    for file in files:
        _check_keys(file, key, layout)
        parsed = tf.data.TFRecordDataset(file).batch(_LABEL_BATCH).map(lambda r: tf.io.parse_example(r, features))
        try:
            batches = [{name: values.numpy() for name, values in batch.items()} for batch in parsed]
        except tf.errors.OpError as error:
            raise DataError(key, f"{file}: cannot read its records: {_first_line(error)}") from None
        found = np.concatenate([b[layout.label_key] for b in batches]) if batches else np.zeros(0, np.int64)
        counts.append(len(found))
        labels.append(found)
        if layout.weight_key is not None:
            where = f"{file}, feature {layout.weight_key!r}"
            file_weights = np.concatenate([b[layout.weight_key] for b in batches]) if batches else np.zeros(0)
            weights.append(checked_weights(file_weights, where, len(found)))
    y = np.concatenate(labels)
    if len(y) == 0:
        raise DataError(key, "the TFRecord files hold no records", files[0] if len(files) == 1 else files)
    return RecordFiles(
        files=tuple(files),
        counts=tuple(counts),
        records=np.arange(len(y)),
        y=y,
        image_key=layout.image_key,
        label_key=layout.label_key,
        image_size=layout.image_size,
        channels=layout.channels,
        shuffle_buffer=layout.shuffle_buffer,
        w=np.concatenate(weights) if layout.weight_key is not None else None,
    )


def _check_keys(file: str, key: str, layout: RecordLayout) -> None:
    """Refuse a file whose first record lacks the image or the label key, naming the keys it has."""
    import tensorflow as tf

    try:
        first = next(iter(tf.data.TFRecordDataset(file).take(1)), None)
    except tf.errors.OpError as error:
        raise DataError(key, f"{file} is not a TFRecord file: {_first_line(error)}") from None
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


def _first_line(error: Exception) -> str:
    message = getattr(error, "message", None) or str(error)
    return message.strip().splitlines()[0] if message.strip() else type(error).__name__
