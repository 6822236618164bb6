"""Reading a split's samples with ``tf.data``, one epoch at a time, in an order fixed by the seed and the epoch.

Every reader gives the same thing: a stream of ``(index, x, y)``, where ``index`` numbers the sample within its
source (the draw of its augmentation depends on it), ``x`` keeps the stored dtype (uint8 for images, int32 token
ids for text) and ``y`` is the target, with the sample's weight when the split has weights
(:func:`accumrun.core.targets.as_targets`). Arrays, image files and text files are visited in
:func:`~accumrun.data.splits.epoch_order`, a seeded permutation per epoch.
TFRecord files cannot be read out of order, so their order is a seeded permutation of the files, read one
after another, through a seeded shuffle buffer of ``data.shuffle_buffer`` records. Either way, ``skip`` passes
over the samples an interrupted epoch already trained on before anything is decoded. Images kept by
``data.cache`` are visited in the order, and under the indices, of the split they were decoded from.

A file (an image, a text) is read and decoded (tokenized) when the order reaches it. Decoding runs in parallel
(``num_parallel_calls=AUTOTUNE``) and keeps the order (``deterministic=True``). Two kinds are read a block of the
epoch's order at a time, one ``tf.numpy_function`` call per block that reads each sample's bytes alone from its file
(:func:`read_spans`), then unbatched: a corpus's windows from its token file (with length grouping,
``data.bucket``, in the grouped order: :mod:`accumrun.data.grouping`), and a text table's records, whose texts the
tokenizer's TensorFlow ops then encode together.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from accumrun.core.targets import Targets, as_targets, each
from accumrun.data.grouping import LengthGroups
from accumrun.data.rows import record_text
from accumrun.data.splits import (
    ArraySplit,
    CachedImages,
    CorpusWindows,
    ImageFiles,
    RecordFiles,
    Split,
    TextFiles,
    TextRows,
    cached_file,
    epoch_order,
)

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
    fault = "does not decode as an image"
    """What an error says of a sample that :meth:`decode` fails on (after the sample's description)."""

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        """The epoch's samples, undecoded, after the first ``skip``."""
        raise NotImplementedError

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """One stored sample from what :meth:`raw_stream` gives."""
        return raw

    def indices(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        """The indices :meth:`raw_stream` gives, in its order, without reading a sample."""
        return tf.data.Dataset.from_tensor_slices(epoch_order(self.size, seed, epoch, shuffle)[skip:].astype(np.int64))

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
            self.y = as_targets(split.y, split.w)

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        order = epoch_order(self.size, seed, epoch, shuffle)[skip:]
        return tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).map(
            lambda i: (i, tf.gather(self.x, i), each(lambda t: tf.gather(t, i), self.y)),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )


class FileReader(Reader):
    """Files, one per sample (images, texts), read as the epoch's order reaches them: ``raw`` is the file's path."""

    def __init__(self, split: ImageFiles | TextFiles) -> None:
        self.size = split.size
        self.paths = split.paths
        self.y, self.w = split.y, split.w

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        order = epoch_order(self.size, seed, epoch, shuffle)[skip:]
        targets = as_targets(self.y[order], None if self.w is None else self.w[order])
        return tf.data.Dataset.from_tensor_slices((order.astype(np.int64), self.paths[order], targets))

    def describe(self, index: int) -> str:
        return str(self.paths[index])


class ImageReader(FileReader):
    """Image files, read and decoded as the epoch's order reaches them."""

    def __init__(self, split: ImageFiles) -> None:
        super().__init__(split)
        self.split = split

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the file's path: reading and decoding are one step of the pipeline."""
        return decode_image(tf.io.read_file(raw), self.split.image_size, self.split.channels)


class TextReader(FileReader):
    """Text files, read and tokenized as the epoch's order reaches them, by the tokenizer's TensorFlow ops
    (:meth:`~accumrun.data.tokenizers.Tokenizer.encode_tensor`, the same ids as its host ``encode``)."""

    fault = "cannot be read as text"

    def __init__(self, split: TextFiles) -> None:
        super().__init__(split)
        self.split = split

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the file's path: its bytes, tokenized to ``length`` ids."""
        text = tf.reshape(tf.io.read_file(raw), [1])
        ids = self.split.tokenizer.encode_tensor(text, self.split.length)
        return tf.ensure_shape(tf.reshape(ids, [self.split.length]), (self.split.length,))


class TextRowsReader(Reader):
    """The records of a text table, in the epoch's order: ``raw`` is a sample's index; blocks of
    :data:`_BLOCK` indices have their records read from the file in one ``tf.numpy_function`` call
    (:func:`read_spans`; :func:`~accumrun.data.rows.record_text` takes each one's text) and tokenized together by
    the tokenizer's TensorFlow ops (the same ids as its host ``encode``)."""

    fault = "cannot be read as text"

    def __init__(self, split: TextRows) -> None:
        self.size = split.size
        self.split = split

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        order = epoch_order(self.size, seed, epoch, shuffle)[skip:].astype(np.int64)
        targets = as_targets(self.split.y[order], None if self.split.w is None else self.split.w[order])
        return tf.data.Dataset.from_tensor_slices((order, order, targets))

    def stream(self, epoch: int, seed: int, shuffle: bool, skip: int = 0) -> tf.data.Dataset:
        """The epoch's samples as ``(index, x, y)``, tokenized a block at a time, in parallel, in order."""
        return _in_blocks(
            self.raw_stream(epoch, seed, shuffle, skip), lambda index, rows, y: (index, self._tokens(rows), y)
        )

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the sample's index: its record's text, tokenized to ``length`` ids."""
        return tf.reshape(self._tokens(tf.reshape(raw, [1])), [self.split.length])

    def _tokens(self, rows: tf.Tensor) -> tf.Tensor:
        texts = tf.numpy_function(self._texts, [rows], tf.string, stateful=False)
        texts = tf.reshape(texts, tf.shape(rows))  # numpy_function knows no shape
        ids = self.split.tokenizer.encode_tensor(texts, self.split.length)
        return tf.ensure_shape(ids, (None, self.split.length))

    def _texts(self, rows: np.ndarray) -> np.ndarray:
        spans = self.split.spans[rows]
        try:
            records = read_spans(self.split.path, spans[:, 0], spans[:, 1] - spans[:, 0])
            texts = [record_text(record, self.split.text) for record in records]
        except (OSError, ValueError) as error:
            # An error of the op, in a pipeline and eagerly alike (where find_undecodable decodes one by one).
            raise tf.errors.InvalidArgumentError(None, None, str(error)) from None
        return np.array([text.encode("utf-8") for text in texts], dtype=object)

    def describe(self, index: int) -> str:
        start = int(self.split.spans[index, 0])
        return f"{self.split.path}, the record at byte {start}"


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
        self._weights = None
        if split.w is not None:  # by record number, as the stream numbers them
            weights = np.zeros(len(held), np.float32)
            weights[split.records] = split.w
            self._weights = tf.constant(weights)

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        def records(name: tf.Tensor, offset: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
            return tf.data.TFRecordDataset(name).enumerate().map(lambda i, r: (offset + i, r))

        numbered = self._numbered(epoch, seed, shuffle, records)
        return numbered.skip(skip).map(self._label_of, num_parallel_calls=AUTOTUNE, deterministic=True)

    def indices(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        """The record numbers in the epoch's order, from the counts alone: no file is read."""

        def numbers(name: tf.Tensor, offset: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
            return tf.data.Dataset.range(offset, offset + count).map(lambda i: (i, i))

        return self._numbered(epoch, seed, shuffle, numbers).skip(skip).map(lambda index, _: index)

    def _numbered(
        self,
        epoch: int,
        seed: int,
        shuffle: bool,
        per_file: Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.data.Dataset],
    ) -> tf.data.Dataset:
        """``(record number, what per_file gives)`` for the epoch: the files in their order, the hold-out filtered
        out, through the shuffle buffer. A shuffle buffer's order depends on its seed and the count of elements,
        not on what they hold, so the records and their numbers alone come out in the same order."""
        split = self.split
        files = np.arange(len(split.files))
        if shuffle:
            files = np.random.default_rng([seed, epoch]).permutation(files)
        names = tf.constant(np.array(split.files)[files])
        offsets = tf.constant(self._offsets[files])
        counts = tf.constant(np.array(split.counts, dtype=np.int64)[files])
        records = tf.data.Dataset.from_tensor_slices((names, offsets, counts)).flat_map(per_file)
        if not split.complete:
            records = records.filter(lambda index, _: self._held[index])
        if shuffle:
            # One seed per epoch, from the run's seed: the same records in the same order, run after run.
            epoch_seed = int(np.random.default_rng([seed, epoch, 1]).integers(2**31))
            records = records.shuffle(split.shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
        return records

    def _label_of(self, index: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Targets]:
        # Every record's label was read at startup, so this cannot fail; the image is parsed with the decode.
        label = tf.io.parse_single_example(record, self._label)[self.split.label_key]
        weight = None if self._weights is None else tf.gather(self._weights, index)
        return index, record, as_targets(tf.cast(label, tf.int32), weight)

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the record: its image is parsed (a record without it fails here) and decoded."""
        image = tf.io.parse_single_example(raw, self._image)[self.split.image_key]
        return decode_image(image, self.split.image_size, self.split.channels)

    def describe(self, index: int) -> str:
        file = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return f"{self.split.files[file]}, record {index - int(self._offsets[file])}"


class CachedReader(Reader):
    """Images kept by ``data.cache``, visited as the split they were decoded from would be (its order, its
    indices, its labels); each sample is a row of the cache: a raw file read as the order reaches it, or a row in
    memory."""

    def __init__(self, split: CachedImages) -> None:
        self.size = split.size
        self.split = split
        self._source = reader_for(split.source)
        source = split.source
        # Row and label of each index the source's order gives: a sample's position, or a record's number.
        slots = sum(source.counts) if isinstance(source, RecordFiles) else source.size
        where = source.records if isinstance(source, RecordFiles) else np.arange(source.size)
        rows, labels = np.zeros(slots, np.int64), np.zeros(slots, source.y.dtype)
        rows[where], labels[where] = split.rows, source.y
        weights = None
        if source.w is not None:
            weights = np.zeros(slots, np.float32)
            weights[where] = source.w
        with tf.device("/CPU:0"):
            self._rows, self._labels = tf.constant(rows), as_targets(labels, weights)
            if split.pixels is not None:
                self._pixels = tf.constant(split.pixels)
            else:
                folder = str(split.folder)
                self._files = tf.constant(np.array([cached_file(folder, row) for row in range(len(split.keys))]))

    def raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        return self._source.indices(epoch, seed, shuffle, skip).map(
            self._looked_up, num_parallel_calls=AUTOTUNE, deterministic=True
        )

    def stream(self, epoch: int, seed: int, shuffle: bool, skip: int = 0) -> tf.data.Dataset:
        """The epoch's samples as ``(index, x, y)``, looked up and read in one parallel map: a cached sample costs
        little more than a ``tf.data`` element, so a second map would cost about as much as the read."""

        def read(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Targets]:
            index, row, label = self._looked_up(index)
            return index, self.decode(row), label

        indices = self._source.indices(epoch, seed, shuffle, skip)
        return indices.map(read, num_parallel_calls=AUTOTUNE, deterministic=True)

    def _looked_up(self, index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Targets]:
        return index, tf.gather(self._rows, index), each(lambda t: tf.gather(t, index), self._labels)

    def decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the sample's row in the cache."""
        if self.split.pixels is not None:
            return tf.gather(self._pixels, raw)
        pixels = tf.io.decode_raw(tf.io.read_file(tf.gather(self._files, raw)), tf.uint8)
        return tf.reshape(pixels, self.split.sample_shape)

    def describe(self, index: int) -> str:
        row = int(self._rows[index])
        where = f"row {row}" if self.split.folder is None else cached_file(self.split.folder, row)
        return f"{where} of data.cache (decoded from {self._source.describe(index)})"


class CorpusReader(Reader):
    """A corpus's windows (:class:`~accumrun.data.splits.CorpusWindows`), read from its token file in the epoch's
    order (each batch grouped by length when ``groups`` is given), :data:`_BLOCK` at a time in one call. A
    window's padding is 0, past its text's end, as an in-memory corpus pads it. Each window's bytes are read alone
    (:func:`read_spans`): memory grows by the windows' bounds and order (about 40 bytes a window), not with the
    text."""

    fault = "cannot be read from the corpus's token file"

    def __init__(self, split: CorpusWindows, groups: LengthGroups | None = None) -> None:
        self.size = split.size
        self.split = split
        self._groups = groups
        self._weights = None if split.w is None else tf.constant(split.w, tf.float32)

    def _order(self, epoch: int, seed: int, shuffle: bool, skip: int) -> np.ndarray:
        order = epoch_order(self.size, seed, epoch, shuffle)
        if self._groups is not None:
            order = self._groups(order)
        return order[skip:].astype(np.int64)

    def indices(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self._order(epoch, seed, shuffle, skip))

    def stream(self, epoch: int, seed: int, shuffle: bool, skip: int = 0) -> tf.data.Dataset:
        """The epoch's windows as ``(index, x, y)``, after the first ``skip``."""
        return _in_blocks(self.indices(epoch, seed, shuffle, skip), self._read)

    def find_undecodable(self, epoch: int, seed: int, shuffle: bool, skip: int, count: int) -> str | None:
        """None: the windows are read from one file, so a failure is the file's, not one sample's."""
        return None

    def _read(self, index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Targets]:
        length = self.split.length
        x, y = tf.numpy_function(self._windows, [index], [tf.int32, tf.int32], stateful=False)
        x, y = tf.ensure_shape(x, (None, length)), tf.ensure_shape(y, (None, length))
        weights = None if self._weights is None else tf.gather(self._weights, index)
        return index, x, as_targets(y, weights)

    def _windows(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The samples and targets of windows ``index``: ``length + 1`` tokens from each begin, cut at its end; a
        sample's token is kept where a target follows it (a short window's last token is a target alone).

        Raises:
            OSError: the token file cannot be read, or is shorter than its windows (changed since it was written).
        """
        begins = self.split.begins[index]
        counts = np.minimum(self.split.ends[index] - begins, self.split.length + 1)
        window = np.zeros((len(index), self.split.length + 1), np.int32)
        spans = read_spans(self.split.file, 4 * begins, 4 * counts)
        for row, (data, count) in enumerate(zip(spans, counts, strict=True)):
            window[row, :count] = np.frombuffer(data, "<i4")
        targets = np.arange(1, self.split.length + 1) < counts[:, None]
        return np.where(targets, window[:, :-1], 0), window[:, 1:]


def read_spans(path: str, starts: np.ndarray, sizes: np.ndarray) -> list[bytes]:
    """The bytes of ``path`` at each of ``starts``, ``sizes`` of them: one ``pread`` each, a copy of those bytes
    alone. A memory-mapped file would count in the process's memory every page the system maps around a read
    (whole large folios of the page cache: about 50 MiB for one block of 64 windows of a 64 MiB token file,
    measured), so memory would follow the file's size; read so, it holds only what was asked for.

    Raises:
        OSError: the file cannot be read, or is shorter than a span (it changed since startup).
    """
    descriptor = os.open(path, os.O_RDONLY)
    try:
        spans = []
        for start, size in zip(starts.tolist(), sizes.tolist(), strict=True):
            data = os.pread(descriptor, size, start)
            if len(data) != size:
                raise OSError(f"{path} holds {os.fstat(descriptor).st_size} bytes, a read reaches byte {start + size}")
            spans.append(data)
        return spans
    finally:
        os.close(descriptor)


_BLOCK = 64
"""Samples read from a file in one call into Python (:func:`_in_blocks`): enough to make the call's cost small
beside the reading and tokenizing, few enough to keep the first batch quick."""


def _in_blocks(stream: tf.data.Dataset, read: Callable[..., Any]) -> tf.data.Dataset:
    """``stream`` read :data:`_BLOCK` elements at a time by ``read`` (one ``tf.numpy_function`` call inside it per
    block, rather than one per sample), in parallel and in order, then unbatched to one element per sample."""
    return stream.batch(_BLOCK).map(read, num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()


def reader_for(split: Split, groups: LengthGroups | None = None) -> Reader:
    """The reader of a split of any kind; ``groups`` orders each batch by length (a corpus's windows on disk:
    arrays are grouped where they are held, :mod:`accumrun.data.resident`).

    Raises:
        ValueError: ``groups`` for a split whose reader keeps the epoch's order as it is.
    """
    if groups is not None and not isinstance(split, CorpusWindows):
        raise ValueError("a reader groups by length only a corpus's windows on disk")
    if isinstance(split, CorpusWindows):
        return CorpusReader(split, groups)
    if isinstance(split, ArraySplit):
        return ArrayReader(split)
    if isinstance(split, ImageFiles):
        return ImageReader(split)
    if isinstance(split, TextFiles):
        return TextReader(split)
    if isinstance(split, TextRows):
        return TextRowsReader(split)
    if isinstance(split, CachedImages):
        return CachedReader(split)
    return RecordReader(split)
