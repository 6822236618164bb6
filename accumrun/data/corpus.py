"""A text corpus (``text_corpus``, ``data.cache: disk``) tokenized once into a token file under ``data.cache_dir``:
every text's int32 ids, in sorted order, and where each text ends, so windows never cross texts.

A text is tokenized in pieces that end at a line break, so only a piece is ever in memory; a tokenizer that may
merge across lines (a preset's BPE ``"\n\n"``) gets each text whole. The folder is named by a hash of what decides
the ids (:func:`corpus_key`), so ids are never stale, and is renamed into place once complete: the one way a
folder under ``data.cache_dir`` is made (:func:`accumrun.data.cache.disk_folder`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accumrun.data.cache import disk_folder, stamp_files
from accumrun.data.source import ArraySource, ReadsBlocks, TokenIds, order_in_blocks, read_spans, taken
from accumrun.data.tokenizers import Tokenizer, TokenizerConfig
from accumrun.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

LAYOUT_VERSION = 1
"""Part of every key: a change of the layout, or of how texts are cut into pieces, makes new folders."""
MARKER = "complete"
TOKENS = "tokens.i32"
SPANS = "ends.npy"
PIECE_BYTES = 1 << 20
"""About the most bytes tokenized at once: a piece's lines end with the first to pass it (a long line, whole)."""


@dataclass(frozen=True)
class TokenFile:
    """A corpus's token file and where each of its files' ids end in it (cumulative)."""

    path: Path
    ends: np.ndarray


@dataclass(frozen=True, eq=False)
class CorpusWindows(ReadsBlocks, TokenIds):
    """Windows over a file of token ids (or the ids ``held`` in memory): ``length`` tokens from ``begins`` (absolute
    offsets), targets one token on, cut at ``ends`` (the text's end) and padded with 0. Each block of windows is
    cut as it is read: from the file with one ``pread`` a window (:func:`~accumrun.data.source.read_spans`), so
    memory follows the windows' count, not the file's size; or from the held ids."""

    file: str
    begins: np.ndarray
    ends: np.ndarray
    length: int
    w: np.ndarray | None = None
    stored: str = "<i4"
    """The file's ids' dtype: little-endian int32 for a corpus's token file, uint16 or uint32 for ``tokens``."""
    shift: int = 0
    """Added to every id read: 1 for a file whose ids start at 0 (``tokens``), where accumrun's 0 is padding."""
    held: np.ndarray | None = None
    """The ids themselves, where they are in memory (``cache: none``), rather than in ``file``."""

    fault = "cannot be read from the corpus's token file"

    @classmethod
    def over(cls, file: str, ends: np.ndarray, length: int, stride: int) -> CorpusWindows:
        """The windows (:func:`window_starts`) of each text in ``file``, the texts ending at ``ends`` (cumulative)."""
        texts = np.concatenate([[0], ends]).astype(np.int64)
        starts = [
            window_starts(e - b, length, stride, b) for b, e in zip(texts[:-1].tolist(), ends.tolist(), strict=True)
        ]
        if len(starts) == 1:  # one file (tokens): its windows share its end, a view, not 4 MiB at 500,000 windows
            return cls(file, starts[0], np.broadcast_to(texts[-1], starts[0].shape), length)
        return cls(file, np.concatenate(starts), np.repeat(texts[1:], [len(text) for text in starts]), length)

    @property
    def size(self) -> int:
        return len(self.begins)

    @property
    def target_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def labels(self) -> np.ndarray:
        """None held (raises ValueError): the targets are the token ids, read with the samples."""
        raise ValueError("a corpus's windows read their targets with their samples")

    @property
    def streamed(self) -> bool:
        """Whether the ids are read from the file as they are needed; ids ``held`` are in memory, as the windows
        cut from them would be (a full batch of them is held as arrays are)."""
        return self.held is None

    @property
    def lengths(self) -> np.ndarray:
        """Each window's real input tokens (not padding), known without reading the file."""
        return np.minimum(self.ends - self.begins - 1, self.length)

    def subset(self, index: np.ndarray) -> CorpusWindows:
        return replace(self, begins=self.begins[index], ends=self.ends[index], w=taken(self.w, index))

    def with_targets(self, check: Any) -> CorpusWindows:
        """The split itself: its targets are its own token ids, read from the token file."""
        return self

    def read_blocks(self, order: np.ndarray) -> tf.data.Dataset:
        return order_in_blocks(order, self._read)

    def find_undecodable(self, epoch: int, seed: int, shuffle: bool, skip: int, count: int) -> str | None:
        """None: the windows are read from one file, so a failure is the file's, not one sample's."""
        return None

    def _read(self, index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        import tensorflow as tf

        from accumrun.core.targets import as_targets

        x, y = tf.numpy_function(self._windows, [index], [tf.int32, tf.int32], stateful=False)
        x, y = tf.ensure_shape(x, (None, self.length)), tf.ensure_shape(y, (None, self.length))
        weights = None if self.w is None else tf.gather(tf.constant(self.w, tf.float32), index)
        return index, x, as_targets(y, weights)

    def _windows(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The samples and targets of windows ``index``; OSError where the token file cannot be read or is shorter
        than its windows (changed since it was written)."""
        begins = self.begins[index]
        counts = np.minimum(self.ends[index] - begins, self.length + 1)
        if self.held is not None:
            return self._cut([self.held[b : b + c] for b, c in zip(begins.tolist(), counts.tolist(), strict=True)])
        width = np.dtype(self.stored).itemsize
        spans = read_spans(self.file, width * begins, width * counts)
        # int32 before the shift: uint16's top id plus one does not fit in uint16.
        return self._cut([np.frombuffer(data, self.stored).astype(np.int32) + self.shift for data in spans])

    def holding(self, ids: np.ndarray) -> CorpusWindows:
        """The windows cut from ``ids`` (the file's, in memory) as they are read."""
        return replace(self, held=ids)

    def as_arrays(self, ids: np.ndarray) -> ArraySource:
        """The windows over ``ids`` (the file's, already in memory) as arrays."""
        counts = np.minimum(self.ends - self.begins, self.length + 1)
        return ArraySource(*self._cut([ids[b : b + c] for b, c in zip(self.begins, counts, strict=True)]))

    def _cut(self, windows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Samples and targets of windows of up to ``length + 1`` ids, padded with 0: a short window's last id is
        a target alone."""
        window = np.zeros((len(windows), self.length + 1), np.int32)
        for row, ids in enumerate(windows):
            window[row, : len(ids)] = ids
        counts = np.array([len(ids) for ids in windows], np.int64)
        targets = np.arange(1, self.length + 1) < counts[:, None]
        return np.where(targets, window[:, :-1], 0), window[:, 1:]


def window_starts(count: int, length: int, stride: int, first: int = 0) -> np.ndarray:
    """Where the windows of a text of ``count`` tokens from ``first`` start: every ``stride`` tokens, until one
    reaches its last token (so the last may be short); none for a text of fewer than two tokens, which has no
    target."""
    if count < 2:
        return np.zeros(0, np.int64)
    # Starts below count - 1 (a window needs a target), stopping after the first whose window reaches the end.
    below_end = -(-(count - 1) // stride)
    reaching = max(0, -(-(count - length - 1) // stride)) + 1
    starts = np.arange(min(below_end, reaching), dtype=np.int64)
    starts *= stride  # in place: a token file's windows are millions
    starts += first
    return starts


def token_file(files: list[Path], key: str, tokenizer: Tokenizer, config: TokenizerConfig, cache_dir: str) -> TokenFile:
    """The token file of ``files``: found under ``cache_dir`` by its key, or tokenized and renamed into place;
    DataError where a file is empty or not UTF-8, or ``data.cache_dir`` cannot be written."""
    folder = disk_folder(
        cache_dir,
        f"corpus-{corpus_key(files, key, config)}",
        lambda found: _complete(found) is not None,
        lambda into: _write(files, key, tokenizer, into),
        "the corpus's token file",
    )
    found = _complete(folder)
    if found is None:  # complete a moment ago: removed since, by hand or by another process
        raise DataError("data.cache_dir", f"the corpus's token file {folder} went missing as it was opened", cache_dir)
    return found


def corpus_key(files: list[Path], key: str, config: TokenizerConfig) -> str:
    """A hash of what decides the token file: the layout, the tokenizer's identity (with the content of the files
    it reads, and KerasHub's version for one of KerasHub's), and each file's path, size and mtime."""
    identity = config.identity(_file_hash)
    if config.keras_hub:
        try:
            identity["keras_hub"] = metadata.version("keras-hub")
        except metadata.PackageNotFoundError:
            identity["keras_hub"] = None
    settings = {"layout": LAYOUT_VERSION, "piece_bytes": PIECE_BYTES, "tokenizer": identity}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    stamp_files(digest, sorted(files), key)
    return digest.hexdigest()[:32]


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(PIECE_BYTES):
            digest.update(block)
    return digest.hexdigest()


def text_pieces(path: Path, key: str, piece_bytes: int = PIECE_BYTES) -> Iterator[str]:
    """A UTF-8 file's text in pieces of whole lines, each the first to pass ``piece_bytes`` (the last piece ends
    where the file does); DataError where it is empty or not UTF-8, under ``key``, which names the file itself
    where the file is the input (its message then says the path once)."""
    named = "" if key == str(path) else f"{path} "
    offset = 0
    try:
        with path.open("rb") as file:
            # A line break is one byte that no other UTF-8 character contains: a piece never splits a character.
            while lines := file.readlines(piece_bytes):
                piece = b"".join(lines)
                try:
                    yield piece.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataError(key, f"{named}is not UTF-8 text (byte {offset + error.start})") from None
                offset += len(piece)
    except OSError as error:  # the text file's fault, not the cache's
        message = f"cannot read {path}: {error.strerror}" if named else f"cannot read: {error.strerror}"
        raise DataError(key, message) from None
    if offset == 0:
        raise DataError(key, f"{named}is empty")


def read_text(path: Path, key: str) -> str:
    """A file's UTF-8 text; one that is not UTF-8, or empty, is a DataError under ``key``."""
    return "".join(text_pieces(path, key))


def file_ids(path: Path, key: str, tokenizer: Tokenizer, piece_bytes: int = PIECE_BYTES) -> Iterator[np.ndarray]:
    """A file's token ids, piece by piece (:func:`text_pieces`); a tokenizer that may merge across lines gets the
    whole text at once."""
    pieces = text_pieces(path, key, piece_bytes)
    yield from map(tokenizer.ids, pieces if tokenizer.line_local else ["".join(pieces)])


def _write(files: list[Path], key: str, tokenizer: Tokenizer, partial: Path) -> None:
    """Tokenize ``files`` into a new folder ``partial``: the ids, each file's end, and the marker last."""
    partial.mkdir()
    ends = np.zeros(len(files), np.int64)
    total = 0
    with (partial / TOKENS).open("wb") as out:
        for index, path in enumerate(files):
            for ids in file_ids(path, key, tokenizer):
                out.write(np.asarray(ids, "<i4").tobytes())
                total += len(ids)
            ends[index] = total
        out.flush()
        os.fsync(out.fileno())
    np.save(partial / SPANS, ends)
    (partial / MARKER).write_text(json.dumps(_marker(len(files), total)) + "\n")


def _complete(folder: Path) -> TokenFile | None:
    """The token file in ``folder`` when its build finished (its marker agrees with what it holds), else None."""
    try:
        marker = json.loads((folder / MARKER).read_text())
        ends = np.load(folder / SPANS)
        size = (folder / TOKENS).stat().st_size
    except (OSError, ValueError):
        return None
    total = int(ends[-1]) if len(ends) else 0
    if marker != _marker(len(ends), total) or size != 4 * total:
        return None
    return TokenFile(folder / TOKENS, ends)


def _marker(files: int, tokens: int) -> dict[str, object]:
    return {"files": files, "tokens": tokens, "layout": LAYOUT_VERSION}
