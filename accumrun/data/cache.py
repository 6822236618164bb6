"""``data.cache``: a split's decoded samples kept, so that later epochs and later runs skip decoding; a wrapper over
any source whose samples have a fixed shape and that names them by a stable key (image files, TFRecord records).

- ``memory``: the split is decoded once, at load, in one parallel ``tf.data`` pass. A split read by index (an image
  folder, a text folder) becomes an :class:`~accumrun.data.splits.ArraySplit`, visited as its files were (the same
  ``epoch_order`` over the same positions); a TFRecord split keeps its records' order and numbers, with its rows in
  memory (:class:`Cached`).
- ``disk``: the decoded samples are one ``x.npy`` in a folder under ``data.cache_dir``, rows in the order of the
  samples' sorted keys, read back a block of the epoch's order at a time by one gather (the block's rows sorted,
  read by positioned reads, unsorted), so memory stays flat as the data grows. The folder is named by a hash of
  what decides the samples: the split's files, each file's size and modification time in nanoseconds, the
  source's decode settings, the samples' keys, the layout's version and TensorFlow's. A file added, removed or
  changed gives another folder, so a cache is never served stale; an unchanged split, in a later run, finds its
  folder and starts warm. Weights are never cached (``training.class_weight`` stays out of the key).

A folder is built beside its final name and renamed into place (:func:`accumrun.rundir.atomic.build_once`): a build
that is killed leaves only a partial folder, which is never read, and two processes that build the same folder at
once both end with the complete one. The samples are those the source decodes, byte for byte, so a run with any
cache trains exactly as one without.

A text corpus takes ``disk`` through its own token file (:mod:`accumrun.data.corpus`): its ids, flat, and the
windows' bounds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accumrun.data.source import AUTOTUNE, ReadsBlocks, Source, in_blocks, read_spans
from accumrun.data.splits import ArraySplit
from accumrun.errors import DataError
from accumrun.kinds import CacheMode
from accumrun.rundir.atomic import build_once

if TYPE_CHECKING:
    import tensorflow as tf


LAYOUT_VERSION = 2
"""Part of every key: a change of the layout, or of how samples are decoded, makes new folders (1: a raw file per
image, now ignored)."""
SAMPLES = "x.npy"
_BATCH = 256


@dataclass(frozen=True, eq=False)
class Cached(ReadsBlocks):
    """The decoded samples of ``source``, kept in ``pixels`` (``memory``) or in the ``.npy`` file ``file``
    (``disk``). ``source`` still decides the order, the labels and each sample's index (the draw of its
    augmentation), so training sees exactly what decoding gives. Rows are matched to samples by their keys, so a
    subset of the split still finds its rows."""

    source: Source
    keys_cached: np.ndarray
    """The cached samples' keys, sorted: row ``r`` holds ``keys_cached[r]``."""
    file: str | None = None
    pixels: np.ndarray | None = None

    @property
    def w(self) -> np.ndarray | None:  # type: ignore[override]
        return self.source.w

    @property
    def size(self) -> int:
        return self.source.size

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.source.sample_shape

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype

    @property
    def labels(self) -> np.ndarray:
        return self.source.labels

    @property
    def indices(self) -> np.ndarray:
        return self.source.indices

    @property
    def streamed(self) -> bool:
        return self.pixels is None

    def subset(self, index: np.ndarray) -> Cached:
        return replace(self, source=self.source.subset(index))

    def with_weights(self, w: np.ndarray) -> Cached:
        return replace(self, source=self.source.with_weights(w))

    def with_targets(self, check: Any) -> Cached:
        return replace(self, source=self.source.with_targets(check))

    def order(self, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
        return self.source.order(epoch, seed, shuffle)

    @cached_property
    def _lookups(self) -> tuple[tf.Tensor, Any]:
        """The row and the targets of each index the source's order gives (a position, or a record's number)."""
        import tensorflow as tf

        from accumrun.core.targets import as_targets

        index = self.source.indices
        slots = int(index.max()) + 1 if len(index) else 0
        rows, labels = np.zeros(slots, np.int64), np.zeros(slots, self.labels.dtype)
        rows[index] = np.searchsorted(self.keys_cached, np.asarray(self.source.keys))
        labels[index] = self.labels
        weights = None
        if self.w is not None:
            weights = np.zeros(slots, np.float32)
            weights[index] = self.w
        with tf.device("/CPU:0"):
            return tf.constant(rows), as_targets(labels, weights)

    def read_blocks(self, order: np.ndarray) -> tf.data.Dataset:
        """Samples ``order`` a block at a time: their rows looked up, then one gather in memory, or one read of the
        file."""
        import tensorflow as tf

        from accumrun.core.targets import each

        rows, labels = self._lookups  # made here, eagerly: not inside the function that the map traces
        pixels = None if self.pixels is None else self._pixels

        def block(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
            row = tf.gather(rows, index)
            if pixels is not None:
                x = tf.gather(pixels, row)
            else:
                x = tf.numpy_function(self._gathered, [row], tf.as_dtype(self.dtype), stateful=False)
                x = tf.ensure_shape(x, (None, *self.sample_shape))
            return index, x, each(lambda t: tf.gather(t, index), labels)

        return in_blocks(tf.data.Dataset.from_tensor_slices(order.astype(np.int64)), block)

    @cached_property
    def _pixels(self) -> tf.Tensor:
        import tensorflow as tf

        with tf.device("/CPU:0"):
            return tf.constant(self.pixels)

    @cached_property
    def _layout(self) -> tuple[int, int]:
        """Where the rows of the ``.npy`` file start, and the bytes of one row."""
        # Opening the map reads the header alone; the rows are read by positioned reads (see _gathered).
        start = int(np.load(str(self.file), mmap_mode="r").offset)
        return start, int(np.prod(self.sample_shape)) * self.dtype.itemsize

    def _gathered(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` of the file: read in ascending order (one positioned read each), put back in order."""
        start, row_bytes = self._layout
        ascending = np.argsort(rows, kind="stable")
        spans = read_spans(str(self.file), start + rows[ascending] * row_bytes, np.full(len(rows), row_bytes))
        out = np.empty((len(rows), *self.sample_shape), self.dtype)
        out[ascending] = np.frombuffer(b"".join(spans), self.dtype).reshape(out.shape)
        return out

    def find_undecodable(self, epoch: int, seed: int, shuffle: bool, skip: int, count: int) -> str | None:
        """None: the samples are read from one file (or memory), so a failure is the file's, not one sample's."""
        return None


def cached(split: Source, mode: CacheMode, cache_dir: str) -> Source:
    """``split`` with its decoded samples kept as ``mode`` says (``split`` itself for ``none``).

    Raises:
        DataError: a sample does not decode, a file went missing, or ``cache_dir`` cannot be written.
    """
    if mode is CacheMode.NONE:
        return split
    if mode is CacheMode.MEMORY:
        samples = np.empty((split.size, *split.sample_shape), split.dtype)
        for start, x in _decoded(split):
            samples[start : start + len(x)] = x
        if split.indexed:
            return ArraySplit(samples, split.labels, split.w)
        return Cached(split, keys_cached=np.asarray(split.keys), pixels=samples)
    keys = np.sort(np.asarray(split.keys))
    folder = Path(cache_dir).expanduser() / cache_key(split, keys)
    try:
        build_once(folder, lambda found: _is_complete(found, split), lambda partial: _write(split, partial))
    except OSError as error:
        raise _unwritable(error, cache_dir) from None
    return Cached(split, keys_cached=keys, file=str(folder / SAMPLES))


def cache_key(split: Source, keys: np.ndarray) -> str:
    """The name of ``split``'s disk cache: its size and sample shape, then a hash of everything that decides its
    samples (see the module's description).

    Raises:
        DataError: a file cannot be read.
    """
    import tensorflow as tf

    settings, files = split.cache_identity()
    settings = {**settings, "layout": LAYOUT_VERSION, "tensorflow": tf.__version__}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for file in files:
        try:
            stat = os.stat(file)
        except OSError as error:
            raise DataError("data", f"cannot read {file} to cache it: {error.strerror}") from None
        digest.update(f"{os.path.abspath(file)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    digest.update("\0".join(str(key) for key in keys).encode())
    shape = "x".join(str(d) for d in split.sample_shape)
    return f"{split.size}x{shape}-{digest.hexdigest()[:32]}"


def _write(split: Source, partial: Path) -> None:
    """Decode ``split`` into a new folder ``partial``: ``x.npy``, rows in the order of the sorted keys, written a
    batch at a time after its header."""
    partial.mkdir()
    ordered = split.subset(np.argsort(np.asarray(split.keys), kind="stable"))
    header = {"descr": np.lib.format.dtype_to_descr(split.dtype), "fortran_order": False}
    with (partial / SAMPLES).open("wb") as out:
        np.lib.format.write_array_header_2_0(out, {**header, "shape": (split.size, *split.sample_shape)})
        for _, x in _decoded(ordered):
            out.write(np.ascontiguousarray(x, split.dtype).tobytes())
        out.flush()
        os.fsync(out.fileno())


def _is_complete(folder: Path, split: Source) -> bool:
    """Whether ``folder`` holds a finished cache of ``split``'s size, shape and dtype (the rename puts only a
    finished folder at the name, so a readable header of the right shape and a file of its size is one)."""
    try:
        samples = np.load(folder / SAMPLES, mmap_mode="r")
    except (OSError, ValueError):
        return False
    expected = (split.size, *split.sample_shape)
    return samples.shape == expected and samples.dtype == split.dtype


def _decoded(split: Source) -> Iterator[tuple[int, np.ndarray]]:
    """The split's samples in its stored order (a folder's list, a TFRecord split's record numbers), in batches,
    each with the position of its first sample.

    Raises:
        DataError: a sample does not decode; the message names it.
    """
    import tensorflow as tf

    batches = split.stream(0, 0, shuffle=False).map(lambda index, x, y: x).batch(_BATCH).prefetch(AUTOTUNE)
    start = 0
    iterator = iter(batches)
    while True:
        try:
            x = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            where = split.find_undecodable(0, 0, False, start, _BATCH)
            detail = (error.message or type(error).__name__).strip().splitlines()[0]
            if where is None:
                raise DataError("data", f"reading the data to cache failed: {detail}") from None
            raise DataError("data", f"{where} {split.fault} ({detail})") from None
        yield start, x.numpy()
        start += len(x)


def _unwritable(error: OSError, cache_dir: str) -> DataError:
    reason = f"{error.strerror}: {error.filename}" if error.strerror and error.filename else str(error)
    return DataError("data.cache_dir", f"cannot write the image cache there ({reason})", cache_dir)
