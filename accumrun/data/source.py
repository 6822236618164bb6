"""The one source protocol: what every kind of data is to the rest of accumrun (after Keras' ``DataAdapter``).

A :class:`Source` is one split; its read is the epoch's samples as a ``tf.data`` stream of ``(index, x, y)``: ``index``
numbers the sample within its source (its augmentation's draw depends on it), ``x`` keeps the stored dtype, and ``y``
is the target, weighted where the split has weights (:func:`accumrun.core.targets.as_targets`). Nothing here imports
TensorFlow at import time, so that the config loads and the file sources list their files without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf

    from accumrun.data.grouping import LengthGroups

AUTOTUNE = -1
"""``tf.data.AUTOTUNE``, without importing TensorFlow."""

BLOCK = 64
"""Samples read in one call into Python (:func:`in_blocks`): enough to make the call's cost small beside the
reading, few enough to keep the first batch quick."""


class Source:
    """One split of data behind the one protocol; a subclass per kind of source. Most kinds read by index, in
    :meth:`order`; a kind that cannot read out of order (TFRecord) gives its own order and overrides :meth:`stream`."""

    y: np.ndarray
    """The targets, where the kind holds them (see :attr:`labels`)."""
    w: np.ndarray | None
    """One weight per sample (``data.weight``, or ``training.class_weight`` for the training split), or None."""
    fault: ClassVar[str] = "does not decode as an image"
    """What an error says of a sample that does not decode (after the sample's description)."""
    labelled_files: ClassVar[bool] = False
    """Files listed under their class labels: they pose classification alone, and their hold-out is seeded."""
    indexed: ClassVar[bool] = True
    """Whether the samples are read by index (in :meth:`order`), rather than in an order of the kind's own."""
    streaming: ClassVar[str] = "this folder streams its files"
    """How the samples are read, for a message that needs them in memory."""
    gathers: ClassVar[bool] = False
    """Whether :meth:`gather` reads any of the samples in one call (the disk cache): a feeder then reads each chunk
    so, rather than build a ``tf.data`` pipeline every epoch."""

    @property
    def size(self) -> int:
        return len(self.labels)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def dtype(self) -> np.dtype:
        raise NotImplementedError

    @property
    def target_shape(self) -> tuple[int, ...]:
        return tuple(self.labels.shape[1:])

    @property
    def labels(self) -> np.ndarray:
        """The targets the split holds (class labels, values), one per sample."""
        return self.y

    @property
    def lengths(self) -> np.ndarray | None:
        """Each sample's real length (its token ids that are not padding), where it is known before reading."""
        return None

    @property
    def in_memory(self) -> ArraySource | None:
        """The split as arrays in host memory (:mod:`accumrun.data.resident` may hold it as one tensor), or None."""
        return None

    @property
    def streamed(self) -> bool:
        """Whether the samples are read as they are needed rather than held in memory."""
        return self.in_memory is None

    @property
    def keys(self) -> np.ndarray | None:
        """What names each sample for ``data.cache`` (a path, a record's number), sortable and stable; or None."""
        return None

    @property
    def indices(self) -> np.ndarray:
        """Each sample's index in the stream (its position; a record's number), in the split's order."""
        return np.arange(self.size)

    def cache_identity(self) -> tuple[dict[str, Any], list[str]]:
        """What decides the decoded samples besides the files (settings), and the files they are read from."""
        raise NotImplementedError

    def subset(self, index: np.ndarray) -> Source:
        raise NotImplementedError

    def with_weights(self, w: np.ndarray) -> Source:
        """The split with ``w`` as its samples' weights (one per sample, in its order)."""
        return dataclasses.replace(self, w=w)  # type: ignore[type-var]

    def with_targets(self, check: Callable[[np.ndarray], np.ndarray]) -> Source:
        """The split with its held targets replaced by ``check(labels)`` (checked for the task)."""
        return dataclasses.replace(self, y=check(self.labels))  # type: ignore[type-var]

    def order(self, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
        """The indices of the epoch's samples, in the kind's order for the epoch: a function of these alone (readers
        visit them as :meth:`visits` says)."""
        return epoch_order(self.size, seed, epoch, shuffle)

    def stream(
        self, epoch: int, seed: int, shuffle: bool, skip: int = 0, groups: LengthGroups | None = None
    ) -> tf.data.Dataset:
        """The epoch's samples as ``(index, x, y)`` after the first ``skip``; ``groups`` sorts each batch by length."""
        return self.read(self._ordered(epoch, seed, shuffle, skip, groups))

    def blocks(
        self, epoch: int, seed: int, shuffle: bool, skip: int = 0, groups: LengthGroups | None = None
    ) -> tf.data.Dataset:
        """The same samples as :meth:`stream`, in batches of at most :data:`BLOCK`, for the feeder to cut into
        chunks (a kind that reads a block in one call gives them with no copy per sample)."""
        return self.stream(epoch, seed, shuffle, skip, groups).batch(BLOCK)

    def gather(self, order: np.ndarray) -> tuple[tf.Tensor, Any]:
        """Samples ``order`` as one chunk ``(x, y)``, in that order, on the host (where :attr:`gathers`)."""
        raise NotImplementedError

    def visits(self, epoch: int, seed: int, shuffle: bool, groups: LengthGroups | None = None) -> np.ndarray:
        """The indices of the epoch's samples in the order every reader visits them: :meth:`order`, each batch
        sorted by length where ``groups`` says (bucketed padding). The one place the order is made."""
        order = self.order(epoch, seed, shuffle)
        return order if groups is None else groups(order)

    def _ordered(self, epoch: int, seed: int, shuffle: bool, skip: int, groups: LengthGroups | None) -> np.ndarray:
        return self.visits(epoch, seed, shuffle, groups)[skip:].astype(np.int64, copy=False)

    def read(self, order: np.ndarray) -> tf.data.Dataset:
        """Samples ``order`` as ``(index, x, y)``, in that order, decoded in parallel."""
        return self._decoded(self._raw(order))

    def _decoded(self, raw: tf.data.Dataset) -> tf.data.Dataset:
        return raw.map(
            lambda index, raw, y: (index, self._decode(raw), y), num_parallel_calls=AUTOTUNE, deterministic=True
        )

    def _raw(self, order: np.ndarray) -> tf.data.Dataset:
        """Samples ``order`` undecoded, as ``(index, raw, y)``: ``raw`` is whatever is cheap to pass along."""
        raise NotImplementedError

    def _decode(self, raw: tf.Tensor) -> tf.Tensor:
        return raw

    def _raw_stream(self, epoch: int, seed: int, shuffle: bool, skip: int) -> tf.data.Dataset:
        return self._raw(self._ordered(epoch, seed, shuffle, skip, None))

    def describe(self, index: int) -> str:
        """Where sample ``index`` comes from, for an error message."""
        return f"sample {index}"

    def find_undecodable(self, epoch: int, seed: int, shuffle: bool, skip: int, count: int) -> str | None:
        """The first of the ``count`` samples after ``skip`` in the epoch that does not decode, described; None
        if they all do (or the fault is not in decoding them)."""
        import tensorflow as tf

        with contextlib.suppress(tf.errors.OpError):  # the stream itself failed: not a fault of one sample
            for index, raw, _ in self._raw_stream(epoch, seed, shuffle, skip).take(count):
                try:
                    self._decode(raw)
                except tf.errors.OpError:
                    return self.describe(int(index))
        return None


@dataclass(frozen=True, eq=False)
class ArraySource(Source):
    """Samples and targets held in memory, in the samples' stored dtype, and optionally a weight per sample;
    gathered in the epoch's order from one host copy, made once, when read through ``tf.data``."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.x.dtype

    @property
    def lengths(self) -> np.ndarray:
        """Each row's ids that are not padding (token ids, for bucketed padding)."""
        from accumrun.core.tokens import PADDING_ID

        return np.count_nonzero(self.x.reshape(len(self.x), -1) != PADDING_ID, axis=1)

    @property
    def in_memory(self) -> ArraySource:
        return self

    def subset(self, index: np.ndarray) -> ArraySource:
        return ArraySource(self.x[index], self.y[index], taken(self.w, index))

    @cached_property
    def _tensors(self) -> tuple[tf.Tensor, Any]:
        import tensorflow as tf

        from accumrun.core.targets import as_targets

        with tf.device("/CPU:0"):
            return tf.constant(self.x), as_targets(self.y, self.w)

    def read(self, order: np.ndarray) -> tf.data.Dataset:
        import tensorflow as tf

        from accumrun.core.targets import each

        x, y = self._tensors
        return tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).map(
            lambda i: (i, tf.gather(x, i), each(lambda t: tf.gather(t, i), y)),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )

    _raw = read  # already decoded


def taken(w: np.ndarray | None, index: np.ndarray) -> np.ndarray | None:
    """The rows ``index`` of an optional per-sample array."""
    return None if w is None else w[index]


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which training samples are visited in ``epoch`` (0-based): a function of these alone."""
    if not shuffle:
        return np.arange(size)
    return np.random.default_rng([seed, epoch]).permutation(size)


class EncodedImages(Source):
    """A kind whose samples are images, decoded to uint8 of ``image_size`` and ``channels`` as they are read."""

    image_size: tuple[int, int]
    channels: int

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (*self.image_size, self.channels)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8)


class TokenIds(Source):
    """A kind whose samples are ``length`` int32 token ids (0 pads)."""

    length: int
    fault = "cannot be read as text"

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32)


class ReadsBlocks(Source):
    """A kind that reads :data:`BLOCK` samples in one call (one ``tf.numpy_function`` call per block, rather than
    one per sample) in :meth:`read_blocks`: its stream is its blocks, unbatched."""

    def blocks(
        self, epoch: int, seed: int, shuffle: bool, skip: int = 0, groups: LengthGroups | None = None
    ) -> tf.data.Dataset:
        return self.read_blocks(self._ordered(epoch, seed, shuffle, skip, groups))

    def read(self, order: np.ndarray) -> tf.data.Dataset:
        return self.read_blocks(order).unbatch()

    def read_blocks(self, order: np.ndarray) -> tf.data.Dataset:
        """Samples ``order`` in batches of at most :data:`BLOCK`, in that order."""
        raise NotImplementedError


def in_blocks(stream: tf.data.Dataset, read: Callable[..., Any]) -> tf.data.Dataset:
    """``stream`` read :data:`BLOCK` elements at a time by ``read``, in parallel and in order."""
    return stream.batch(BLOCK).map(read, num_parallel_calls=AUTOTUNE, deterministic=True)


def order_in_blocks(order: np.ndarray, read: Callable[..., Any]) -> tf.data.Dataset:
    """Samples ``order`` read :data:`BLOCK` at a time by ``read`` (given a block's indices), in parallel and in
    order. Each block's indices are sliced from ``order`` in Python: as a tensor, ``order`` would be copied into
    the stream's graph (4 MiB a copy at 500,000 samples), and memory would follow the sample count."""
    import tensorflow as tf

    order = order.astype(np.int64, copy=False)

    def indices(start: tf.Tensor) -> tf.Tensor:
        block = tf.numpy_function(lambda at: order[at : at + BLOCK], [start], tf.int64, stateful=False)
        return tf.ensure_shape(block, (None,))

    starts = tf.data.Dataset.range(0, len(order), BLOCK)
    return starts.map(indices).map(read, num_parallel_calls=AUTOTUNE, deterministic=True)


def read_spans(path: str, starts: np.ndarray, sizes: np.ndarray) -> list[bytes]:
    """The bytes of ``path`` at each of ``starts``, ``sizes`` of them: one ``pread`` each. Not a memory map: the
    process's memory would count every page the system maps around a read (about 50 MiB for one block of 64
    windows of a 64 MiB token file, measured), so memory would follow the file's size.

    Raises:
        OSError: the file cannot be read, or is shorter than a span (it changed since startup).
    """
    spans = []
    with open(path, "rb", buffering=0) as file:
        descriptor = file.fileno()
        for start, size in zip(starts.tolist(), sizes.tolist(), strict=True):
            data = os.pread(descriptor, size, start)
            if len(data) != size:
                raise OSError(f"{path} holds {os.fstat(descriptor).st_size} bytes, a read reaches byte {start + size}")
            spans.append(data)
    return spans
