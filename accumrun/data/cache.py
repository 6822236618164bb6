"""``data.cache``: a split's decoded samples kept, so that later epochs and runs skip decoding; a wrapper over any
source whose samples have a fixed shape and a stable key (image files, TFRecord records).

- ``memory``: decoded once, at load, into rows in the split's order (:class:`Cached`). A split read by index
  offers them as arrays (:attr:`Cached.in_memory`), which the feeder holds as one tensor
  (:mod:`accumrun.data.resident`); a TFRecord split keeps its records' order and numbers.
- ``disk``: one ``x.npy``, rows in the order of the samples' sorted keys, read a chunk at a time by positioned
  reads, so memory stays flat as the data grows. Its folder under ``data.cache_dir`` is named by a hash of what
  decides the samples (the files' sizes and modification times in nanoseconds, the decode settings, the keys, the
  layout's version and TensorFlow's): a changed split gets another folder, never a stale one. Weights are not cached.

Every folder under ``data.cache_dir`` is made one way (:func:`disk_folder`), this cache's and a text corpus's token
file (:mod:`accumrun.data.corpus`, whose windows are cut from its ids as they are read): named by a hash that
stamps the files read (:func:`stamp_files`), built beside its name and renamed into place
(:func:`accumrun.rundir.atomic.build_once`), so a killed build is never read and two processes that build it at
once both end with the complete one. The samples are the source's, byte for byte, so a cached run trains exactly as
one without.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from accumrun.data.source import AUTOTUNE, ArraySource, ReadsBlocks, Source, order_in_blocks, taken
from accumrun.errors import DataError
from accumrun.kinds import CacheMode
from accumrun.rundir.atomic import build_once

if TYPE_CHECKING:
    import tensorflow as tf

LAYOUT_VERSION = 2
"""Part of every key: a change of the layout or of decoding makes new folders (1: a raw file per image)."""
SAMPLES = "x.npy"
_BATCH = 256


@dataclass(frozen=True, eq=False)
class Cached(ReadsBlocks):
    """The decoded samples of ``source``, in ``pixels`` (``memory``) or in the ``.npy`` file ``file`` from byte
    ``start`` (``disk``). ``source`` still decides the order, the targets and each sample's index (the draw of its
    augmentation); rows are matched to samples by their keys, so a subset still finds its rows."""

    source: Source
    keys_cached: np.ndarray
    """The cached samples' keys: row ``r`` holds ``keys_cached[r]`` (sorted on disk, the split's order in memory)."""
    file: str | None = None
    start: int = 0
    pixels: np.ndarray | None = None
    gathers: ClassVar[bool] = True

    @property
    def w(self) -> np.ndarray | None:  # type: ignore[override]
        return self.source.w

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

    @property
    def in_memory(self) -> ArraySource | None:
        """The rows as arrays in the split's order, where they are in memory and the split is read by index."""
        return self._arrays if self.pixels is not None and self.source.indexed else None

    @property
    def lengths(self) -> np.ndarray | None:
        held = self.in_memory
        return self.source.lengths if held is None else held.lengths

    @cached_property
    def _arrays(self) -> ArraySource:
        assert self.pixels is not None
        rows = self._lookups[1]
        # The split the rows were decoded from, as it is until a later subset: its rows themselves, not a copy.
        whole = len(rows) == len(self.pixels) and np.array_equal(rows, np.arange(len(rows)))
        return ArraySource(self.pixels if whole else self.pixels[rows], self.labels, self.w)

    def subset(self, index: np.ndarray) -> Cached:
        return replace(self, source=self.source.subset(index))

    def with_weights(self, w: np.ndarray) -> Cached:
        return replace(self, source=self.source.with_weights(w))

    def with_targets(self, check: Any) -> Cached:
        return replace(self, source=self.source.with_targets(check))

    def order(self, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
        return self.source.order(epoch, seed, shuffle)

    @cached_property
    def _lookups(self) -> tuple[np.ndarray, np.ndarray]:
        """The position of each index the order gives (a position, or a record's number), and each position's row."""
        index = self.source.indices
        positions = np.zeros(int(index.max()) + 1 if len(index) else 0, np.int64)
        positions[index] = np.arange(len(index))
        by_key = np.argsort(self.keys_cached, kind="stable")
        return positions, by_key[np.searchsorted(self.keys_cached, np.asarray(self.source.keys), sorter=by_key)]

    def gather(self, order: np.ndarray) -> tuple[tf.Tensor, Any]:
        import tensorflow as tf

        from accumrun.core.targets import as_targets

        at = self._lookups[0][order]
        with tf.device("/CPU:0"):
            return tf.constant(self._samples(at)), as_targets(self.labels[at], taken(self.w, at))

    def read_blocks(self, order: np.ndarray) -> tf.data.Dataset:
        import tensorflow as tf

        from accumrun.core.targets import as_targets, each

        with tf.device("/CPU:0"):  # made here, eagerly: not inside the function that the map traces
            positions, targets = tf.constant(self._lookups[0]), as_targets(self.labels, self.w)

        def block(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
            at = tf.gather(positions, index)
            x = tf.numpy_function(self._samples, [at], tf.as_dtype(self.dtype), stateful=False)
            return index, tf.ensure_shape(x, (None, *self.sample_shape)), each(lambda t: tf.gather(t, at), targets)

        return order_in_blocks(order, block)

    def _samples(self, at: np.ndarray) -> np.ndarray:
        """The samples at positions ``at``: a gather in memory, or one ``preadv`` per row (ascending) into its place.
        Not a memory map: the process would count every page mapped around a read (large folios of the page cache),
        so its memory would follow the file's size.

        Raises:
            OSError: the file cannot be read, or is shorter than a row (it changed since startup).
        """
        rows = self._lookups[1][at]
        if self.pixels is not None:
            return self.pixels[rows]
        out = np.empty((len(rows), *self.sample_shape), self.dtype)
        ascending = np.argsort(rows, kind="stable")
        row_bytes = out.itemsize * int(np.prod(self.sample_shape))
        descriptor = os.open(str(self.file), os.O_RDONLY)
        try:
            for i, offset in zip(ascending.tolist(), (self.start + rows[ascending] * row_bytes).tolist(), strict=True):
                if os.preadv(descriptor, [out[i]], offset) != row_bytes:
                    size = os.fstat(descriptor).st_size
                    raise OSError(f"{self.file} holds {size} bytes, a read reaches byte {offset + row_bytes}")
        finally:
            os.close(descriptor)
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
        return Cached(split, keys_cached=np.asarray(split.keys), pixels=samples)
    keys = np.sort(np.asarray(split.keys))
    what = "the image cache"
    folder = disk_folder(
        cache_dir,
        cache_key(split, keys),
        lambda found: _is_complete(found, split),
        lambda into: _write(split, into),
        what,
    )
    file = folder / SAMPLES
    try:
        start = int(np.load(file, mmap_mode="r").offset)  # the map reads the header alone
    except OSError as error:
        raise unwritable(error, what, cache_dir) from None
    return Cached(split, keys_cached=keys, file=str(file), start=start)


def disk_folder(
    cache_dir: str, name: str, complete: Callable[[Path], bool], write: Callable[[Path], None], what: str
) -> Path:
    """The folder ``name`` under ``cache_dir`` (``~`` expanded): found ``complete``, or made by ``write`` (given a
    new folder's path) beside its name and renamed into place.

    Raises:
        DataError: ``cache_dir`` cannot be written (``what`` names the cache).
    """
    folder = Path(cache_dir).expanduser() / name
    try:
        build_once(folder, complete, write)
    except OSError as error:
        raise unwritable(error, what, cache_dir) from None
    return folder


def unwritable(error: OSError, what: str, cache_dir: str) -> DataError:
    """The error for ``what`` (a cache) that cannot be written under ``cache_dir``, or read back."""
    reason = f"{error.strerror}: {error.filename}" if error.strerror and error.filename else str(error)
    return DataError("data.cache_dir", f"cannot write {what} there ({reason})", cache_dir)


def stamp_files(digest: Any, files: Iterable[str | Path], key: str, purpose: str = "") -> None:
    """Add each file's absolute path, size and modification time (ns) to ``digest``: a changed file, another key.

    Raises:
        DataError: a file cannot be read (under ``key``; ``purpose`` says why it was read).
    """
    for file in files:
        try:
            stat = os.stat(file)
        except OSError as error:
            raise DataError(key, f"cannot read {file}{purpose}: {error.strerror}") from None
        digest.update(f"{os.path.abspath(file)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())


def cache_key(split: Source, keys: np.ndarray) -> str:
    """The name of ``split``'s disk cache: its size and sample shape, then a hash of what decides its samples.

    Raises:
        DataError: a file cannot be read.
    """
    import tensorflow as tf

    settings, files = split.cache_identity()
    settings = {**settings, "layout": LAYOUT_VERSION, "tensorflow": tf.__version__}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    stamp_files(digest, files, "data", " to cache it")
    digest.update("\0".join(str(key) for key in keys).encode())
    shape = "x".join(str(d) for d in split.sample_shape)
    return f"{split.size}x{shape}-{digest.hexdigest()[:32]}"


def _write(split: Source, partial: Path) -> None:
    """Decode ``split`` into a new folder: ``x.npy``, rows in the order of the sorted keys, a batch at a time."""
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
    """Whether ``folder`` holds a cache of ``split``'s shape and dtype (only a finished build gets the name)."""
    try:
        samples = np.load(folder / SAMPLES, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return samples.shape == (split.size, *split.sample_shape) and samples.dtype == split.dtype


def _decoded(split: Source) -> Iterator[tuple[int, np.ndarray]]:
    """The split's samples in its stored order, in batches, each with the position of its first sample.

    Raises:
        DataError: a sample does not decode; the message names it.
    """
    import tensorflow as tf

    start = 0
    try:
        for x in split.stream(0, 0, shuffle=False).map(lambda index, x, y: x).batch(_BATCH).prefetch(AUTOTUNE):
            yield start, x.numpy()
            start += len(x)
    except tf.errors.OpError as error:
        where = split.find_undecodable(0, 0, False, start, _BATCH)
        detail = (error.message or type(error).__name__).strip().splitlines()[0]
        if where is None:
            raise DataError("data", f"reading the data to cache failed: {detail}") from None
        raise DataError("data", f"{where} {split.fault} ({detail})") from None
