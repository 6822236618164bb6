"""The one feeder: a split's samples to the step, in chunks (a whole batch, or one sub-batch of it).

The chunks have the caller's sizes, the same every epoch, filled in the epoch's order (the source's), in the stored
dtype, augmented per sample when training asks for it; each reaches the device whole when the step takes it.
Without augmentation, arrays in memory are held as one tensor (:mod:`accumrun.data.resident`), and a source that
reads any samples in one call (the disk cache) reads each chunk so, ahead of the step (:meth:`Feeder.read`): a
``tf.data`` pipeline built every epoch would cost more than reading a small epoch does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import count

import numpy as np
import tensorflow as tf

from accumrun.core.targets import Targets
from accumrun.data.augment import Augmentation
from accumrun.data.grouping import LengthGroups
from accumrun.data.read_ahead import ReadAhead
from accumrun.data.resident import ResidentArrays, resident, resides
from accumrun.data.source import AUTOTUNE, BLOCK, Source
from accumrun.errors import DataError

_PIPELINE_PREFIX = re.compile(
    r"^(\{\{function_node [^}]*\}\}\s*)?(Error in user-defined function passed to .*? transformation with "
    r"iterator: \S+: )?(\w+Error: )?"
)
"""What ``tf.data`` puts before the error of a function it ran: TensorFlow's bookkeeping, not the user's problem."""


def gathers(split: Source, augmented: bool) -> bool:
    """Whether a feeder reads each chunk of ``split`` in one gather (:meth:`Feeder.read`): the source
    :attr:`~accumrun.data.source.Source.gathers`, it is not held as one tensor, and no sample is augmented."""
    return split.gathers and not augmented and not resides(split, augmented)


class Feeder:
    """Serves a split's samples in chunks of ``chunk_sizes`` (one epoch's), in the order of the seed and epoch.

    With ``augmentation``, every sample is drawn for ``(seed, epoch, index)``; ``training`` false applies it in
    inference mode (centre crops). ``on_device`` holds arrays on the device for the feeder's life.
    ``group_by_length``, the sizes of an epoch's batches, orders each batch's samples by length (bucketed padding,
    :mod:`accumrun.data.grouping`); the chunks then cut the grouped batches.
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
        self.source = split
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
        self.resident: ResidentArrays | None = resident(
            split,
            self._starts,
            augmented=augmentation is not None,
            seed=seed,
            shuffle=shuffle,
            on_device=on_device,
            groups=self._groups,
        )
        """The arrays on the device, when the split is held there; else None (it is read as it is needed)."""
        self.gathers = gathers(split, augmentation is not None)
        """Whether each chunk is read in one gather (:meth:`read`)."""
        self._ahead: ReadAhead[tuple[int, int], tuple[tf.Tensor, Targets]] = ReadAhead(lambda at: self._gather(*at))
        self._order: tuple[int, np.ndarray] | None = None

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
        chunks = self._gathered(epoch, skip) if self.gathers else iter(self._pipeline(epoch, skip))
        for done in count(skip):
            try:
                x, y = next(chunks)
            except StopIteration:
                return
            except (tf.errors.OpError, OSError) as error:  # a file that does not decode, went missing, or was cut
                raise self._read_error(epoch, done, error) from None
            yield x, y

    def read(self, chunks: list[tuple[int, int]], then: list[tuple[int, int]]) -> tuple[tf.Tensor, Targets]:
        """The chunks ``chunks`` (``(epoch, chunk)`` each, 0-based) as one ``(x, y)``, one after another, where the
        feeder :attr:`gathers`; the chunks of ``then``, which the caller expects to ask for next, are read while it
        trains on these.

        Raises:
            DataError: the data cannot be read.
        """
        parts = self._ahead.take(chunks, then)
        if len(parts) == 1:
            return parts[0]
        return tf.nest.map_structure(lambda *part: tf.concat(part, 0), *parts)

    def _gathered(self, epoch: int, skip: int) -> Iterator[tuple[tf.Tensor, Targets]]:
        """The chunks, each read while the step trains on the one before."""
        for chunk in range(skip, self.count):
            yield self.read([(epoch, chunk)], [(epoch, chunk + 1)] if chunk + 1 < self.count else [])

    def _gather(self, epoch: int, chunk: int) -> tuple[tf.Tensor, Targets]:
        """Chunk ``chunk`` of ``epoch``, read in one gather."""
        if self._order is None or self._order[0] != epoch:  # asked for again and again, but once per epoch
            self._order = (epoch, self.source.visits(epoch, self._seed, self._shuffle, self._groups).astype(np.int64))
        try:
            return self.source.gather(self._order[1][self._starts[chunk] : self._starts[chunk + 1]])
        except (tf.errors.OpError, OSError) as error:  # the file went missing, or was cut
            raise self._read_error(epoch, chunk, error) from None

    def _pipeline(self, epoch: int, skip: int) -> tf.data.Dataset:
        source, seed, augmentation = self.source, self._seed, self._augmentation
        start, sizes = int(self._starts[skip]), self._sizes[skip:]
        if augmentation is None:  # the source's blocks, re-cut: no copy per sample
            batches = source.blocks(epoch, seed, self._shuffle, start, self._groups)
        else:
            batches = (
                source.stream(epoch, seed, self._shuffle, start, self._groups)
                .map(
                    lambda index, x, y: (index, augmentation(x, index, seed, epoch, self._training), y),
                    num_parallel_calls=AUTOTUNE,
                    deterministic=True,
                )
                .batch(max(sizes))
            )
        batches = batches.rebatch(tf.constant(sizes, tf.int64)).take(len(sizes))
        return batches.map(lambda index, x, y: (x, y)).prefetch(AUTOTUNE)

    def _read_error(self, epoch: int, chunk: int, error: Exception) -> DataError:
        """The error for a chunk that could not be read: the first sample from the chunk's start that does not decode
        (up to a largest chunk or a block past the chunk, which it may have been cut from), or what was reported."""
        start, samples = int(self._starts[chunk]), self._sizes[chunk] + max(*self._sizes, BLOCK)
        where = self.source.find_undecodable(epoch, self._seed, self._shuffle, start, samples)
        message = (error.message or "") if isinstance(error, tf.errors.OpError) else str(error)
        lines = message.strip().splitlines()
        detail = _PIPELINE_PREFIX.sub("", lines[0]) if lines else type(error).__name__
        if where is None:
            return DataError("data", f"reading the data failed: {detail}")
        return DataError("data", f"{where} {self.source.fault} ({detail})")
