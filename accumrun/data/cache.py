"""``data.cache``: an image split's decoded, resized images kept, so that later epochs and later runs skip decoding.

- ``memory``: the split is decoded once, at load, in one parallel ``tf.data`` pass. An image folder's split becomes
  an :class:`~accumrun.data.splits.ArraySplit`, visited as its files were (the same ``epoch_order`` over the same
  positions); a TFRecord split keeps its records' order and numbers, with its rows in memory.
- ``disk``: each image is one raw uint8 file in a folder under ``data.cache_dir``, read back as the epoch's order
  reaches it (so memory stays flat as the data grows). The folder is named by a hash of what decides the pixels:
  the split's files (sorted), each file's size and modification time in nanoseconds, ``image_size``, the channels,
  for TFRecord the image key and the records chosen, the layout's version and TensorFlow's. A file added, removed
  or changed gives another folder, so a cache is never served stale; an unchanged split, in a later run, finds
  its folder and starts warm.

A folder is built beside its final name (a hidden ``.NAME.<pid>-<hex>.partial``), gets a ``complete`` marker last,
and is renamed into place (:func:`accumrun.rundir.atomic.build_once`): a build that is killed leaves only a
partial folder, which is never read (delete it freely). The pixels are those of
:func:`~accumrun.data.readers.decode_image`, byte for byte, so a run with any cache trains exactly as one without.

A text folder takes ``memory`` alone: its files are tokenized once, at load, by the reader training would stream
them with (the same ids), into an :class:`~accumrun.data.splits.ArraySplit` of int32 token ids. A text corpus
takes ``disk`` alone (``none`` holds its windows in memory already): its loader tokenizes it into one token file
under ``data.cache_dir``, keyed and written as these folders are (:mod:`accumrun.data.corpus`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import tensorflow as tf

from accumrun.config.schema import ImageSourceConfig, TextFolderConfig
from accumrun.data.readers import AUTOTUNE, reader_for
from accumrun.data.splits import (
    ArraySplit,
    CachedImages,
    ImageFiles,
    RecordFiles,
    Split,
    TextFiles,
    cached_file,
    identities,
)
from accumrun.errors import DataError
from accumrun.kinds import CacheMode
from accumrun.rundir.atomic import build_once

LAYOUT_VERSION = 1
"""Part of every key: a change of the layout, or of how images are decoded and resized, makes new folders."""
MARKER = "complete"
_BATCH = 256


def cached(split: Split, config: ImageSourceConfig | TextFolderConfig) -> Split:
    """``split`` with its decoded images (or token ids) kept as ``data.cache`` says (``split`` itself for ``none``).

    Raises:
        DataError: an image does not decode, a file went missing, or ``data.cache_dir`` cannot be written.
    """
    if config.cache is CacheMode.NONE or not isinstance(split, ImageFiles | RecordFiles | TextFiles):
        return split
    if config.cache is CacheMode.MEMORY:
        samples = np.empty((split.size, *split.sample_shape), split.dtype)
        for start, x in _decoded(split):
            samples[start : start + len(x)] = x
        if isinstance(split, RecordFiles):
            return CachedImages(split, keys=split.records, pixels=samples)
        return ArraySplit(samples, split.y, split.w)
    assert isinstance(config, ImageSourceConfig) and not isinstance(split, TextFiles)  # text takes memory alone
    keys = np.sort(identities(split))
    folder = _disk_folder(split, keys, config)
    return CachedImages(split, keys=keys, folder=str(folder))


def cache_key(split: ImageFiles | RecordFiles, keys: np.ndarray) -> str:
    """The name of ``split``'s disk cache: its size and sample shape, then a hash of everything that decides its
    pixels (see the module's description).

    Raises:
        DataError: a file cannot be read.
    """
    settings = {
        "layout": LAYOUT_VERSION,
        "tensorflow": tf.__version__,
        "source": type(split).__name__,
        "image_size": list(split.image_size),
        "channels": split.channels,
    }
    files = [str(path) for path in keys] if isinstance(split, ImageFiles) else list(split.files)
    if isinstance(split, RecordFiles):
        settings["image_key"] = split.image_key
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for file in files:
        try:
            stat = os.stat(file)
        except OSError as error:
            raise DataError("data", f"cannot read {file} to cache it: {error.strerror}") from None
        digest.update(f"{os.path.abspath(file)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    if isinstance(split, RecordFiles):
        digest.update(np.asarray(keys, np.int64).tobytes())
    shape = "x".join(str(d) for d in split.sample_shape)
    return f"{split.size}x{shape}-{digest.hexdigest()[:32]}"


def _disk_folder(split: ImageFiles | RecordFiles, keys: np.ndarray, config: ImageSourceConfig) -> Path:
    """The complete cache folder of ``split``: found, or built and renamed into place."""
    folder = Path(config.cache_dir).expanduser() / cache_key(split, keys)
    try:
        build_once(folder, lambda found: _is_complete(found, split), lambda partial: _write(split, partial))
    except OSError as error:
        raise _unwritable(error, config) from None
    return folder


def _write(split: ImageFiles | RecordFiles, partial: Path) -> None:
    """Decode ``split`` into one raw file per row in a new folder ``partial``, rows in the order of its sorted
    identities, and write the marker last."""
    partial.mkdir()
    # Images are decoded from the sorted paths, so their rows come in order; records already stream in order.
    if isinstance(split, ImageFiles):
        split = replace(split, paths=np.sort(split.paths))
    for start, x in _decoded(split):
        for row, image in enumerate(x, start):
            Path(cached_file(str(partial), row)).write_bytes(image.tobytes())
    (partial / MARKER).write_text(json.dumps(_marker(split)) + "\n")


def _is_complete(folder: Path, split: ImageFiles | RecordFiles) -> bool:
    """Whether ``folder`` holds a finished cache of ``split``'s size and shape."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker == _marker(split)


def _marker(split: ImageFiles | RecordFiles) -> dict[str, object]:
    return {"samples": split.size, "shape": list(split.sample_shape), "layout": LAYOUT_VERSION}


def _decoded(split: ImageFiles | RecordFiles | TextFiles) -> Iterator[tuple[int, np.ndarray]]:
    """The split's images (or token ids) in its stored order (a folder's list, a TFRecord split's record numbers),
    in batches, each with the position of its first sample.

    Raises:
        DataError: a sample does not decode; the message names it.
    """
    reader = reader_for(split)
    batches = reader.stream(0, 0, shuffle=False).map(lambda index, x, y: x).batch(_BATCH).prefetch(AUTOTUNE)
    start = 0
    iterator = iter(batches)
    while True:
        try:
            x = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            where = reader.find_undecodable(0, 0, False, start, _BATCH)
            detail = (error.message or type(error).__name__).strip().splitlines()[0]
            if where is None:
                raise DataError("data", f"reading the data to cache failed: {detail}") from None
            raise DataError("data", f"{where} {reader.fault} ({detail})") from None
        yield start, x.numpy()
        start += len(x)


def _unwritable(error: OSError, config: ImageSourceConfig) -> DataError:
    reason = f"{error.strerror}: {error.filename}" if error.strerror and error.filename else str(error)
    return DataError("data.cache_dir", f"cannot write the image cache there ({reason})", config.cache_dir)
