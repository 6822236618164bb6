"""The one feeder: a split's samples to the step, in chunks, through ``tf.data``.

A chunk is what one call of the step takes: a whole batch (``data.feed: batch``) or one sub-batch of it
(``data.feed: sub_batch``, when the batch itself does not fit). The caller gives the sizes of an epoch's chunks,
the same every epoch; the feeder fills them in the epoch's order (see :mod:`accumrun.data.readers`), augmented
per sample when training asks for it, prefetched, in the stored dtype. Each chunk goes to the device whole, in
one transfer, when the step is called with it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from accumrun.data.augment import Augmentation
from accumrun.data.dataset import epoch_order
from accumrun.data.readers import AUTOTUNE, ArrayReader, reader_for
from accumrun.data.splits import Split
from accumrun.errors import DataError


class Feeder:
    """Serves a split's samples in chunks of ``chunk_sizes`` (one epoch's), in the order of the seed and epoch.

    With ``augmentation``, every sample is drawn for ``(seed, epoch, index)``; ``training`` false applies its
    layers in inference mode (centre crops), for validation.
    """

    def __init__(
        self,
        split: Split,
        chunk_sizes: list[int],
        *,
        seed: int,
        shuffle: bool,
        augmentation: Augmentation | None = None,
        training: bool = True,
    ) -> None:
        self.reader = reader_for(split)
        self.count = len(chunk_sizes)
        """The number of chunks in an epoch."""
        self._sizes = [int(size) for size in chunk_sizes]
        self._starts = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)
        self._seed, self._shuffle = seed, shuffle
        self._augmentation, self._training = augmentation, training
        self._gathered = (
            _GatheredChunks(self.reader, self._starts)
            if isinstance(self.reader, ArrayReader) and not augmentation
            else None
        )

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        """The chunks of ``epoch`` (0-based) as ``(x, y)``, less the first ``skip`` (to resume an epoch).

        Raises:
            DataError: a sample does not decode; the message names its file.
        """
        if skip >= self.count:
            return
        if self._gathered is not None:
            yield from self._gathered.chunks(epoch, self._seed, self._shuffle, skip)
            return
        chunks = iter(self._pipeline(epoch, skip))
        done = skip
        while True:
            try:
                x, y = next(chunks)
            except StopIteration:
                return
            except tf.errors.OpError as error:  # a file that does not decode, or went missing, or a truncated one
                raise self._read_error(epoch, done, error) from None
            done += 1
            yield x, y

    def _pipeline(self, epoch: int, skip: int) -> tf.data.Dataset:
        samples = self.reader.stream(epoch, self._seed, self._shuffle, int(self._starts[skip]))
        augmentation, seed, training = self._augmentation, self._seed, self._training
        if augmentation is not None:
            samples = samples.map(
                lambda index, x, y: (index, augmentation(x, index, seed, epoch, training), y),
                num_parallel_calls=AUTOTUNE,
                deterministic=True,
            )
        sizes = self._sizes[skip:]
        return (
            samples.batch(max(sizes))
            .rebatch(tf.constant(sizes, tf.int64))
            .take(len(sizes))
            .map(lambda index, x, y: (x, y))
            .prefetch(AUTOTUNE)
        )

    def _read_error(self, epoch: int, chunk: int, error: tf.errors.OpError) -> DataError:
        """The error for a chunk that could not be read: it names the sample that does not decode, found by
        decoding the chunk's samples one by one, or else says what TensorFlow reported. The chunks are cut from
        batches of the largest chunk's size, so the culprit may lie up to that many samples past the chunk."""
        start, count = int(self._starts[chunk]), self._sizes[chunk] + max(self._sizes)
        where = self.reader.find_undecodable(epoch, self._seed, self._shuffle, start, count)
        message = (error.message or "").strip().splitlines()
        detail = message[0] if message else type(error).__name__
        if where is None:
            return DataError("data", f"reading the data failed: {detail}")
        return DataError("data", f"{where} does not decode as an image ({detail})")


class _GatheredChunks:
    """Arrays without augmentation: each chunk is one gather of rows, in a pipeline built once.

    The pipeline reads the epoch's order from a variable, so a new epoch only assigns it: building a pipeline
    would retrace its gather function (tens of milliseconds, every epoch).
    """

    def __init__(self, reader: ArrayReader, starts: np.ndarray) -> None:
        self._reader = reader
        with tf.device("/CPU:0"):
            self._order = tf.Variable(tf.range(reader.size, dtype=tf.int64), trainable=False)
        bounds = tf.constant(starts)

        def gather(chunk: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            index = self._order[bounds[chunk] : bounds[chunk + 1]]
            return tf.gather(reader.x, index), tf.gather(reader.y, index)

        count = len(starts) - 1
        self._from_chunk = lambda first: tf.data.Dataset.range(first, count).map(gather).prefetch(AUTOTUNE)
        self._pipeline = self._from_chunk(0)

    def chunks(self, epoch: int, seed: int, shuffle: bool, skip: int) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        self._order.assign(epoch_order(self._reader.size, seed, epoch, shuffle).astype(np.int64))
        yield from self._pipeline if not skip else self._from_chunk(skip)
