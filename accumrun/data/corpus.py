"""A text corpus tokenized once into a token file under ``data.cache_dir`` (``text_corpus`` with ``data.cache:
disk``), so that a corpus bigger than memory trains, and a later run over the same files starts warm.

The token file holds the int32 ids (little-endian) of every file, concatenated in the files' sorted order; beside
it, each file's span (where its ids end), so that windows never cross files. Each file is read and tokenized in
pieces that end at a line break (at most :data:`PIECE_BYTES`, a longer line read whole) and written as it goes:
no more than a piece of text, and its ids, is ever in memory. A tokenizer whose tokens never span a line break
(byte, character, word_piece, which split at whitespace first) gives the same ids piece by piece as it gives the
whole text; a preset's tokenizer may merge across lines (a BPE's ``"\\n\\n"``), so each of its files is tokenized
whole.

The folder is named by a hash of what decides the ids: the files (sorted), each file's size and modification time
in nanoseconds, the tokenizer's identity (its name and settings; the content of a vocabulary file, a learned
vocabulary's tokens, a preset's tokenizer files; KerasHub's version for word_piece and a preset), and the layout's
version. A file added, removed or changed gives another folder, so ids are never served stale. As ``data.cache``
does for images (:mod:`accumrun.data.cache`), the folder is built beside its final name, gets a ``complete`` marker
last and is renamed into place (:func:`accumrun.rundir.atomic.build_once`): a killed build leaves only a partial
folder, never read.

The windows are those of an in-memory corpus, start for start (:func:`window_starts`), so both train alike.
No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from accumrun.data.source import ReadsBlocks, TokenIds, in_blocks, read_spans, taken
from accumrun.data.tokenizer_sections import TokenizerConfig
from accumrun.data.tokenizers import Tokenizer
from accumrun.errors import DataError
from accumrun.rundir.atomic import build_once

if TYPE_CHECKING:
    import tensorflow as tf

LAYOUT_VERSION = 1
"""Part of every key: a change of the layout, or of how texts are cut into pieces, makes new folders."""
MARKER = "complete"
TOKENS = "tokens.i32"
SPANS = "ends.npy"
PIECE_BYTES = 1 << 20
"""The most bytes tokenized at once (but a longer line, read whole)."""
_NEWLINE = b"\n"


@dataclass(frozen=True)
class TokenFile:
    """A corpus's token file and where each of its files' ids end in it (cumulative)."""

    path: Path
    ends: np.ndarray

    @property
    def begins(self) -> np.ndarray:
        return np.concatenate([[0], self.ends[:-1]]).astype(np.int64)


@dataclass(frozen=True, eq=False)
class CorpusWindows(ReadsBlocks, TokenIds):
    """The windows of a corpus whose token ids lie in one file: the ids of every text, concatenated. A window is
    ``length`` tokens from ``begins`` (an absolute token offset) and the targets one token on, cut at ``ends`` (its
    text's end) and padded with 0; so windows never cross texts, and none is read before the epoch's order reaches
    it. They are read :data:`~accumrun.data.source.BLOCK` at a time in one call, each window's bytes alone
    (:func:`~accumrun.data.source.read_spans`): memory grows by the windows' bounds and order (about 40 bytes a
    window), not with the text."""

    file: str
    """The token file: ids of ``stored`` dtype."""
    begins: np.ndarray
    ends: np.ndarray
    length: int
    w: np.ndarray | None = None
    stored: str = "<i4"
    """The file's ids' dtype: little-endian int32 for a corpus's token file, uint16 or uint32 for ``tokens``."""
    shift: int = 0
    """Added to every id read: 1 for a file whose ids start at 0 (``tokens``), where accumrun's 0 is padding."""

    fault = "cannot be read from the corpus's token file"

    @property
    def size(self) -> int:
        return len(self.begins)

    @property
    def target_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def labels(self) -> np.ndarray:
        """None held: a corpus's targets are its token ids, read with its samples.

        Raises:
            ValueError: always.
        """
        raise ValueError("a corpus's windows on disk read their targets with their samples")

    @property
    def lengths(self) -> np.ndarray:
        """Each window's real input tokens (its ids that are not padding), known without reading the file."""
        return np.minimum(self.ends - self.begins - 1, self.length)

    def subset(self, index: np.ndarray) -> CorpusWindows:
        return replace(self, begins=self.begins[index], ends=self.ends[index], w=taken(self.w, index))

    def with_targets(self, check: Any) -> CorpusWindows:
        """The split itself: its targets are its own token ids, read from the token file."""
        return self

    def read_blocks(self, order: np.ndarray) -> tf.data.Dataset:
        import tensorflow as tf

        return in_blocks(tf.data.Dataset.from_tensor_slices(order.astype(np.int64)), self._read)

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
        """The samples and targets of windows ``index``: ``length + 1`` tokens from each begin, cut at its end; a
        sample's token is kept where a target follows it (a short window's last token is a target alone).

        Raises:
            OSError: the token file cannot be read, or is shorter than its windows (changed since it was written).
        """
        begins = self.begins[index]
        counts = np.minimum(self.ends[index] - begins, self.length + 1)
        window = np.zeros((len(index), self.length + 1), np.int32)
        width = np.dtype(self.stored).itemsize
        spans = read_spans(self.file, width * begins, width * counts)
        for row, (data, count) in enumerate(zip(spans, counts, strict=True)):
            # int32 before the shift: uint16's top id plus one does not fit in uint16.
            window[row, :count] = np.frombuffer(data, self.stored).astype(np.int32) + self.shift
        targets = np.arange(1, self.length + 1) < counts[:, None]
        return np.where(targets, window[:, :-1], 0), window[:, 1:]


def window_starts(count: int, length: int, stride: int) -> np.ndarray:
    """Where the windows of a text of ``count`` tokens start: every ``stride`` tokens, until one reaches its last
    token (so the last may be short); none for a text of fewer than two tokens, which has no target."""
    if count < 2:
        return np.zeros(0, np.int64)
    # Starts below count - 1 (a window needs a target), stopping after the first whose window reaches the end.
    below_end = -(-(count - 1) // stride)
    reaching = max(0, -(-(count - length - 1) // stride)) + 1
    return np.arange(min(below_end, reaching), dtype=np.int64) * stride


def corpus_windows(
    files: list[Path],
    key: str,
    tokenizer: Tokenizer,
    config: TokenizerConfig,
    cache_dir: str,
    length: int,
    stride: int,
    path: str,
) -> CorpusWindows:
    """The windows of ``files`` (those ``path`` names) read from their token file under ``cache_dir`` (found, or
    written first).

    Raises:
        DataError: under ``key``, a file is empty or not UTF-8 (named, with the byte), or no file has two tokens;
            ``data.cache_dir`` cannot be written.
    """
    tokens = token_file(files, key, tokenizer, config, cache_dir)
    begins, ends = [], []
    for begin, end in zip(tokens.begins, tokens.ends, strict=True):
        starts = begin + window_starts(int(end - begin), length, stride)
        begins.append(starts)
        ends.append(np.full(len(starts), end, np.int64))
    if not sum(len(starts) for starts in begins):
        raise DataError(key, "holds no text of two tokens or more, the least a next-token target needs", path)
    return CorpusWindows(str(tokens.path), np.concatenate(begins), np.concatenate(ends), length)


def token_file(files: list[Path], key: str, tokenizer: Tokenizer, config: TokenizerConfig, cache_dir: str) -> TokenFile:
    """The token file of ``files``: found under ``cache_dir`` by its key, or tokenized and renamed into place.

    Raises:
        DataError: see :func:`corpus_windows`.
    """
    folder = Path(cache_dir).expanduser() / f"corpus-{corpus_key(files, key, config)}"
    try:
        build_once(
            folder, lambda found: _complete(found) is not None, lambda partial: _write(files, key, tokenizer, partial)
        )
    except OSError as error:
        reason = f"{error.strerror}: {error.filename}" if error.strerror and error.filename else str(error)
        raise DataError("data.cache_dir", f"cannot write the corpus's token file there ({reason})", cache_dir) from None
    found = _complete(folder)
    if found is None:  # complete a moment ago: removed since, by hand or by another process
        raise DataError("data.cache_dir", f"the corpus's token file {folder} went missing as it was opened", cache_dir)
    return found


def corpus_key(files: list[Path], key: str, config: TokenizerConfig) -> str:
    """A hash of what decides the token file (see the module's description).

    Raises:
        DataError: a file cannot be read.
    """
    settings = {"layout": LAYOUT_VERSION, "piece_bytes": PIECE_BYTES, "tokenizer": tokenizer_identity(config)}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for file in sorted(files):
        try:
            stat = os.stat(file)
        except OSError as error:
            raise DataError(key, f"cannot read {file}: {error.strerror}") from None
        digest.update(f"{os.path.abspath(file)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def tokenizer_identity(config: TokenizerConfig) -> dict[str, object]:
    """What decides the ids a tokenizer gives: its settings, the content of the files it reads, and KerasHub's
    version for a tokenizer of KerasHub's."""
    identity = config.identity(_file_hash)
    if config.keras_hub:
        identity["keras_hub"] = _version("keras-hub")
    return identity


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(PIECE_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def text_pieces(path: Path, key: str, piece_bytes: int = PIECE_BYTES) -> Iterator[str]:
    """A UTF-8 file's text in pieces of at most ``piece_bytes`` that end at a line break (a longer line is one
    piece; the last piece ends where the file does).

    Raises:
        DataError: under ``key``, the file is empty or not UTF-8 (with the byte's offset in the file).
    """
    offset = 0
    try:
        with path.open("rb") as file:
            for piece in _line_pieces(file, piece_bytes):
                try:
                    yield piece.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataError(key, f"{path} is not UTF-8 text (byte {offset + error.start})") from None
                offset += len(piece)
    except OSError as error:  # the text file's fault, not the cache's
        raise DataError(key, f"cannot read {path}: {error.strerror}") from None
    if offset == 0:
        raise DataError(key, f"{path} is empty")


def _line_pieces(file: BinaryIO, piece_bytes: int) -> Iterator[bytes]:
    rest = bytearray()
    while True:
        # Fill a piece up to piece_bytes; a line longer than that reads on a piece at a time to its end.
        block = file.read(piece_bytes - len(rest) if len(rest) < piece_bytes else piece_bytes)
        if not block:
            if rest:
                yield bytes(rest)
            return
        rest += block
        cut = rest.rfind(_NEWLINE) + 1
        if cut:
            # A line break is one byte that no other UTF-8 character contains: a piece never splits a character.
            yield bytes(rest[:cut])
            del rest[:cut]


def file_ids(path: Path, key: str, tokenizer: Tokenizer, piece_bytes: int = PIECE_BYTES) -> Iterator[np.ndarray]:
    """A file's token ids, piece by piece (see the module's description); a tokenizer that may merge across lines
    gets the whole text at once.

    Raises:
        DataError: see :func:`text_pieces`.
    """
    if not tokenizer.line_local:
        yield tokenizer.ids("".join(text_pieces(path, key, piece_bytes)))
        return
    for text in text_pieces(path, key, piece_bytes):
        yield tokenizer.ids(text)


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
