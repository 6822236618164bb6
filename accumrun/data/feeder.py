"""The one feeder: a split's samples to the step, in chunks.

A chunk is what one call of the step takes: a whole batch (``data.feed: batch``) or one sub-batch of it. The caller
gives the sizes of an epoch's chunks, the same every epoch; the feeder fills them in the epoch's order (the
source's, see :mod:`accumrun.data.source`), in the stored dtype, augmented per sample when training asks for it.
Each chunk reaches the device whole, in one transfer, when the step is called with it. Without augmentation,
arrays are held as one tensor (:mod:`accumrun.data.resident`, on the device for training and validation) and a
chunk is a gather there; a source that reads any samples in one call (the disk cache) reads each chunk so; neither
builds a ``tf.data`` pipeline per epoch, which would cost more than reading a small epoch. Token ids for bucketed
padding come with each batch's samples ordered by length (:mod:`accumrun.data.grouping`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from accumrun.data.augment import Augmentation
from accumrun.data.grouping import LengthGroups
from accumrun.data.resident import ResidentArrays
from accumrun.data.source import AUTOTUNE, BLOCK, Source
from accumrun.errors import DataError


class Feeder:
    """Serves a split's samples in chunks of ``chunk_sizes`` (one epoch's), in the order of the seed and epoch.

    With ``augmentation``, every sample is drawn for ``(seed, epoch, index)``; ``training`` false applies its
    layers in inference mode (centre crops), for validation. ``on_device`` holds arrays on the device for the
    feeder's life (a run's training and validation data). ``group_by_length``, the sizes of an epoch's batches,
    orders each batch's samples by their real length (see :mod:`accumrun.data.grouping`); the chunks then cut the
    grouped batches.
    """

    def __init__(
        self,
        split: Source,
        chunk_sizes: list[int],
        *,
        seed: int,
        shuffle: bool,
        augmentation: Augmentation | None = None,
        training: bool = True,
        on_device: bool = False,
        group_by_length: list[int] | None = None,
    ) -> None:
        self.count = len(chunk_sizes)
        """The number of chunks in an epoch."""
        self._sizes = [int(size) for size in chunk_sizes]
        self._starts = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)
        self._seed, self._shuffle = seed, shuffle
        self._augmentation, self._training = augmentation, training
        self._groups = None
        if group_by_length is not None:
            if split.lengths is None:
                raise ValueError(
                    "length grouping needs the samples' lengths before the epoch (token ids, a corpus's windows)"
                )
            self._groups = LengthGroups(split.lengths, tuple(int(size) for size in group_by_length))
        self.resident: ResidentArrays | None = None
        """The arrays on the device, when the split is held there; else None (it is read through ``tf.data``)."""
        held = split.in_memory
        if held is not None and not augmentation:
            self.resident = ResidentArrays(
                held, self._starts, seed=seed, shuffle=shuffle, on_device=on_device, groups=self._groups
            )
        self.source = split

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        """The chunks of ``epoch`` (0-based) as ``(x, y)``, less the first ``skip`` (to resume an epoch).

        Raises:
            DataError: a sample does not decode (the message names its file), or the data cannot be read.
        """
        if skip >= self.count:
            return
        if self.resident is not None:
            yield from self.resident.chunks(epoch, skip)
            return
        gathers = self.source.gathers and self._augmentation is None
        chunks = self._gathered(epoch, skip) if gathers else iter(self._pipeline(epoch, skip))
        done = skip
        while True:
            try:
                x, y = next(chunks)
            except StopIteration:
                return
            except (tf.errors.OpError, OSError, ValueError) as error:  # a file that does not decode, or went missing
                # (a gather raises what the pipeline's function would have raised inside TensorFlow: OSError, or
                # ValueError for a truncated file's header)
                raise self._read_error(epoch, done, error) from None
            done += 1
            yield x, y

    def _gathered(self, epoch: int, skip: int) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        order = self.source.order(epoch, self._seed, self._shuffle)
        if self._groups is not None:
            order = self._groups(order)
        for chunk in range(skip, self.count):
            yield self.source.gather(order[self._starts[chunk] : self._starts[chunk + 1]].astype(np.int64))

    def _pipeline(self, epoch: int, skip: int) -> tf.data.Dataset:
        source, seed, start = self.source, self._seed, int(self._starts[skip])
        augmentation, training = self._augmentation, self._training
        sizes = self._sizes[skip:]
        if augmentation is None:  # the source's blocks, re-cut: no copy per sample
            batches = source.blocks(epoch, seed, self._shuffle, start, self._groups)
        else:
            batches = (
                source.stream(epoch, seed, self._shuffle, start, self._groups)
                .map(
                    lambda index, x, y: (index, augmentation(x, index, seed, epoch, training), y),
                    num_parallel_calls=AUTOTUNE,
                    deterministic=True,
                )
                .batch(max(sizes))
            )
        return (
            batches.rebatch(tf.constant(sizes, tf.int64))
            .take(len(sizes))
            .map(lambda index, x, y: (x, y))
            .prefetch(AUTOTUNE)
        )

    def _read_error(self, epoch: int, chunk: int, error: Exception) -> DataError:
        """The error for a chunk that could not be read: it names the sample that does not decode, found by
        decoding the chunk's samples one by one, or else says what was reported. The chunks are cut from batches
        of the largest chunk's size (or the source's blocks), so the culprit may lie up to that many samples past
        the chunk."""
        start, count = int(self._starts[chunk]), self._sizes[chunk] + max(*self._sizes, BLOCK)
        where = self.source.find_undecodable(epoch, self._seed, self._shuffle, start, count)
        message = (error.message or "") if isinstance(error, tf.errors.OpError) else str(error)
        lines = message.strip().splitlines()
        detail = _PIPELINE_PREFIX.sub("", lines[0]) if lines else type(error).__name__
        if where is None:
            return DataError("data", f"reading the data failed: {detail}")
        return DataError("data", f"{where} {self.source.fault} ({detail})")


_PIPELINE_PREFIX = re.compile(
    r"^(\{\{function_node [^}]*\}\}\s*)?(Error in user-defined function passed to .*? transformation with "
    r"iterator: \S+: )?(\w+Error: )?"
)
"""What ``tf.data`` puts before the error of a function it ran (the graph's node, the function, the iterator, the
exception's class): TensorFlow's bookkeeping, not the user's problem."""
