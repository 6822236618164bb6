"""Arrays held for the whole run: a batch is a gather of rows where the data already lives.

A split of arrays in memory, without augmentation, is made a tensor once (:func:`resident`, the one place that
decides it): on the device for training and validation (crossing once per run, not once per batch), in host memory
for the one-off passes. An epoch's batches are gathers in the split's visiting order
(:meth:`~accumrun.data.source.Source.visits`), as every other reader's.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from accumrun.core.targets import Targets, as_targets, each
from accumrun.data.grouping import LengthGroups
from accumrun.data.source import Source

DEVICE_LIMIT = 2**30
"""The most bytes of arrays a GPU holds for the run; larger arrays stay in host memory (activations come first)."""


def resides(split: Source, augmented: bool) -> bool:
    """Whether ``split`` is held as one tensor for its feeder's life: its arrays are in memory and no sample is
    augmented (augmentation draws per sample, in a pipeline)."""
    return split.in_memory is not None and not augmented


def resident(
    split: Source,
    starts: np.ndarray,
    *,
    augmented: bool,
    seed: int,
    shuffle: bool,
    on_device: bool,
    groups: LengthGroups | None = None,
) -> ResidentArrays | None:
    """``split`` held as tensors (:class:`ResidentArrays`) where it :func:`resides`, else None (it is read as it is
    needed)."""
    if not resides(split, augmented):
        return None
    return ResidentArrays(split, starts, seed=seed, shuffle=shuffle, on_device=on_device, groups=groups)


class ResidentArrays:
    """A split's arrays (:attr:`~accumrun.data.source.Source.in_memory`) as tensors, on the device when
    ``on_device`` (and they fit), served in chunks that start at ``starts`` (``len(chunks) + 1`` boundaries) in the
    split's order for each epoch, grouped by length with ``groups``."""

    def __init__(
        self,
        split: Source,
        starts: np.ndarray,
        *,
        seed: int,
        shuffle: bool,
        on_device: bool,
        groups: LengthGroups | None = None,
    ) -> None:
        arrays = split.in_memory
        if arrays is None:
            raise ValueError("only a split whose arrays are in memory is held as tensors")
        self._split = split
        nbytes = arrays.x.nbytes + arrays.y.nbytes + (arrays.w.nbytes if arrays.w is not None else 0)
        on_gpu = on_device and tf.config.list_logical_devices("GPU") and nbytes <= DEVICE_LIMIT
        self.device = "/GPU:0" if on_gpu else "/CPU:0"
        with tf.device(self.device):
            self.x = tf.identity(tf.constant(arrays.x))
            self.y: Targets = each(tf.identity, as_targets(arrays.y, arrays.w))
        self._starts = starts
        self._seed, self._shuffle = seed, shuffle
        self._groups = groups
        self._order: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's order of the samples (the last epoch's is kept: consecutive calls ask for it again)."""
        if self._order is None or self._order[0] != epoch:
            order = self._split.visits(epoch, self._seed, self._shuffle, self._groups)
            self._order = (epoch, order.astype(np.int32))
        return self._order[1]

    def chunk_rows(self, epoch: int, chunk: int) -> np.ndarray:
        """The rows of chunk ``chunk`` of ``epoch``."""
        return self.order(epoch)[self._starts[chunk] : self._starts[chunk + 1]]

    def chunks(self, epoch: int, skip: int = 0) -> Iterator[tuple[tf.Tensor, Targets]]:
        """The chunks of ``epoch`` after the first ``skip``, each gathered on the device (targets with weights)."""
        for chunk in range(skip, len(self._starts) - 1):
            yield self._gathered(self.chunk_rows(epoch, chunk))

    def _gathered(self, rows: np.ndarray) -> tuple[tf.Tensor, Targets]:
        # Not a device scope held open across a yield: a scope left by another generator in between (the
        # validation feeder's, a new epoch's) would break the nesting of TensorFlow's device stack.
        with tf.device(self.device):
            indices = tf.constant(rows)
            return tf.gather(self.x, indices), each(lambda t: tf.gather(t, indices), self.y)
