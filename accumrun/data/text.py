"""Text sources, tokenized to int32 token ids: ``text_folder`` (one subfolder of ``.txt`` files per class),
``text_corpus`` (plain ``.txt`` files for a language model), and the text column of a table (a CSV's
``data.text``; JSON Lines in :mod:`accumrun.data.jsonl`), which streams as a text folder does (see
:mod:`accumrun.data.rows`) or with ``data.cache: memory`` is tokenized at load.

Tokens are int32, ``sequence_length`` of them per sample: a longer text is cut there, a shorter one padded with
id 0, which the models mask. ``data.tokenizer`` picks the tokenizer (:mod:`accumrun.data.tokenizers`).

A text folder streams as an image folder does: startup lists its files and checks each (read once, UTF-8, not
empty, and let go), and each file is read and tokenized as TensorFlow ops when the epoch's order reaches it (see
:mod:`accumrun.data.files`), so a folder bigger than memory trains.

A corpus is cut file by file into windows of ``sequence_length + 1`` tokens, ``stride`` apart: a window's first
``sequence_length`` tokens are the sample, and its last ``sequence_length`` the targets, each the token that follows
the sample's token at that position. A file's last window may be short; its padding (id 0) is no target, so windows
of very different real lengths share a batch and the loss counts only real tokens. The windows are samples like any
other: the validation split, the order of each epoch and resume follow the rules of (seed, epoch, sample).

``data.cache`` says where a corpus's windows live. ``none``: the corpus is tokenized at load and its windows held
as arrays (twice its tokens, or more where windows overlap). ``disk``: it is tokenized once, piece by piece, into a
token file under ``data.cache_dir`` (:mod:`accumrun.data.corpus`), and each window is read from that file as the
epoch's order reaches it: the same windows, index for index, with memory that grows by about 40 bytes a window
(its bounds and the epoch's order), not with the text.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from accumrun.data.corpus import CorpusWindows, corpus_windows, window_starts
from accumrun.data.files import TextFiles
from accumrun.data.section import DEFAULT_SEQUENCE_LENGTH, FileSourceConfig, none_or_memory, refuse_image_keys
from accumrun.data.splits import ArraySplit, Splits
from accumrun.data.tokenizer_sections import ByteTokenizerConfig, TokenizerConfig
from accumrun.data.tokenizers import Tokenizer, tokenizer_for
from accumrun.errors import DataError
from accumrun.kinds import CacheMode, Task
from accumrun.sections import words


class TextSourceConfig(FileSourceConfig):
    """A source of UTF-8 text, each sample tokenized to ``sequence_length`` token ids."""

    tokenizer: TokenizerConfig = Field(default_factory=lambda: ByteTokenizerConfig(name="byte"))
    sequence_length: int = Field(DEFAULT_SEQUENCE_LENGTH, ge=1)
    """Tokens per sample: a longer text is cut, a shorter one padded with id 0 (masked in the model)."""
    bucket: int | None = Field(None, ge=1)
    """Pad each training sub-batch only to its longest text, rounded up to a multiple of this (at most
    ``sequence_length``), so that short sub-batches cost less; unset, every sub-batch keeps ``sequence_length``.
    With it, the samples within each batch are also ordered by their real length (a stable sort) before the batch
    is cut, so that each sub-batch holds texts of similar length (:mod:`accumrun.data.grouping`). Each batch holds
    the same samples either way, and padding is masked, so the update is the same. Dropout draws by a sample's row
    in the batch (:mod:`accumrun.core.draws`), so its masks differ with ``bucket`` and without; with ``bucket``,
    subdivided and plain training still draw alike."""

    @model_validator(mode="after")
    def _no_image_keys(self) -> TextSourceConfig:
        refuse_image_keys(self)
        return self

    @property
    def text_settings(self) -> tuple[TokenizerConfig, int] | None:
        return self.tokenizer, self.sequence_length

    @property
    def token_bucket(self) -> int | None:
        return self.bucket


class TextFolderConfig(TextSourceConfig):
    """``name: text_folder``: one subfolder of UTF-8 ``.txt`` files per class (the layout
    ``keras.utils.text_dataset_from_directory`` reads), tokenized to ``sequence_length`` token ids."""

    needs = {"path": "a folder with one subfolder of .txt files per class"}
    labelled_files = True
    name: Literal["text_folder"]
    cache: Annotated[CacheMode, words(CacheMode)] = CacheMode.NONE
    """``none`` streams: each file is read and tokenized as the epoch's order reaches it. ``memory`` tokenizes each
    split once, at load, and trains from the token ids in memory: faster, for a folder whose ids fit."""

    @field_validator("cache")
    @classmethod
    def _cache_none_or_memory(cls, value: CacheMode) -> CacheMode:
        return none_or_memory(value, "text_folder", "files")

    @property
    def cache_wrapper(self) -> tuple[CacheMode, str]:
        return self.cache, ""


class TextCorpusConfig(TextSourceConfig):
    """``name: text_corpus``: plain UTF-8 ``.txt`` files (a file, a folder of them, or a glob) for a language model,
    each cut into windows of ``sequence_length`` input tokens, ``stride`` tokens apart; the targets are the same
    tokens one position on."""

    needs = {"path": "a .txt file, a folder of .txt files, or a glob of them"}
    stride: int | None = Field(None, ge=1)
    """Tokens between the starts of two windows; unset, ``sequence_length`` (windows that do not overlap)."""
    cache: Annotated[CacheMode, words(CacheMode)] = CacheMode.NONE
    """``none`` tokenizes the corpus at load and holds its windows in memory. ``disk`` tokenizes it once into a
    token file under ``cache_dir``, found again by later runs over the same files, and reads each window from it as
    the epoch's order reaches it: memory grows by about 40 bytes a window, not with the text (see
    :mod:`accumrun.data.corpus`)."""
    cache_dir: str = Field("~/.cache/accumrun/", min_length=1)
    """Where ``cache: disk`` writes (``~`` is expanded): one folder per corpus, named by its files and the
    tokenizer."""

    @field_validator("cache")
    @classmethod
    def _none_or_disk(cls, value: CacheMode) -> CacheMode:
        if value is CacheMode.MEMORY:
            raise ValueError(
                "text_corpus holds its windows in memory (none) or reads them from a token file under "
                "data.cache_dir (disk)"
            )
        return value

    @property
    def window_stride(self) -> int:
        """``stride``, or ``sequence_length`` when it is unset."""
        return self.stride if self.stride is not None else self.sequence_length


def load_text_folder(config: TextFolderConfig, seed: int) -> Splits:
    """The ``.txt`` files under ``data.path`` (and ``data.validation_path``, with the same classes), listed in a
    stable order (by class, then by path) and checked; they are tokenized as they stream.

    Raises:
        DataError: a folder is missing, has fewer than two classes, a class without text files, or a file that
            is empty or not UTF-8; or the two folders' classes differ.
    """
    tokenizer = tokenizer_for(config.tokenizer)
    train, names = _list_folder(Path(config.path), "data.path", tokenizer, config.sequence_length)
    test = None
    if config.validation_path:
        test, val_names = _list_folder(
            Path(config.validation_path), "data.validation_path", tokenizer, config.sequence_length
        )
        if val_names != names:
            raise DataError(
                "data.validation_path",
                f"has classes {', '.join(val_names)}, data.path has {', '.join(names)}; they must be the same",
                config.validation_path,
            )
    return Splits(train, test, class_names=names, vocabulary_size=tokenizer.vocabulary_size)


@dataclass(frozen=True)
class TextColumn:
    """A table's text column (``data.text``), how its cells become ``length`` token ids, and whether they stream
    (``data.cache: none``: read back from the file as training reaches them) or are tokenized at load."""

    column: str
    tokenizer: Tokenizer
    length: int
    stream: bool = False

    def tokens(self, path: Path, cells: Sequence[str], lines: Sequence[int]) -> np.ndarray:
        """The cells' token ids, one row each.

        Raises:
            DataError: under ``data.text``, a cell is empty (named by the file and its line number).
        """
        return self.tokenizer.encode(checked_cells(path, self.column, cells, lines), self.length)


def checked_cells(path: Path, column: str, cells: Sequence[str], lines: Sequence[int]) -> Sequence[str]:
    """A text column's ``cells``, each a sample's text.

    Raises:
        DataError: under ``data.text``, a cell is empty (named by the file and its line number).
    """
    for cell, line in zip(cells, lines, strict=True):
        if not cell:
            raise DataError("data.text", f"{path}, line {line}: the text in column {column!r} is empty")
    return cells


def load_text_corpus(config: TextCorpusConfig, seed: int) -> Splits:
    """The windows of the ``.txt`` files that ``data.path`` names (and ``data.validation_path``), in the files'
    sorted order (see the module's docstring): arrays, or with ``data.cache: disk`` read from a token file.

    Raises:
        DataError: no ``.txt`` file is found, a file is empty or not UTF-8, or no file has two tokens (the least
            a window with a target needs); ``data.cache_dir`` cannot be written.
    """
    tokenizer = tokenizer_for(config.tokenizer)

    def windows(path: str, key: str) -> ArraySplit | CorpusWindows:
        length, stride = config.sequence_length, config.window_stride
        if config.cache is CacheMode.DISK:
            files = corpus_files(path, key)
            return corpus_windows(files, key, tokenizer, config.tokenizer, config.cache_dir, length, stride, path)
        return _windows(path, key, tokenizer, length, stride)

    train = windows(config.path, "data.path")
    test = windows(config.validation_path, "data.validation_path") if config.validation_path else None
    return Splits(train, test, vocabulary_size=tokenizer.vocabulary_size, task=Task.CAUSAL_LM)


def corpus_files(path: str, key: str) -> list[Path]:
    """The ``.txt`` files ``path`` names, sorted: the file itself, those under a folder, or those a glob matches.

    Raises:
        DataError: under ``key``, nothing is found.
    """
    given = Path(path)
    if given.is_file():
        return [given]
    if given.is_dir():
        files = sorted(given.rglob("*.txt"))
    else:
        files = sorted(Path(match) for match in glob.glob(path, recursive=True) if Path(match).is_file())
    if not files:
        where = "folder holds no .txt files" if given.is_dir() else "no file found"
        raise DataError(key, where, path)
    return files


def corpus_texts(path: str, key: str) -> list[str]:
    """The texts of the ``.txt`` files ``path`` names, in :func:`corpus_files`' order.

    Raises:
        DataError: under ``key``, nothing is found, or a file is empty or not UTF-8.
    """
    return [read_text(file, key) for file in corpus_files(path, key)]


def _windows(path: str, key: str, tokenizer: Tokenizer, length: int, stride: int) -> ArraySplit:
    x_rows, y_rows = [], []
    for text in corpus_texts(path, key):
        ids = tokenizer.ids(text)
        for start in window_starts(len(ids), length, stride):
            window = ids[start : start + length + 1]
            x_rows.append(_padded(window[:-1], length))
            y_rows.append(_padded(window[1:], length))
    if not x_rows:
        raise DataError(key, "holds no text of two tokens or more, the least a next-token target needs", path)
    return ArraySplit(np.stack(x_rows), np.stack(y_rows))


def _padded(ids: np.ndarray, length: int) -> np.ndarray:
    row = np.zeros(length, np.int32)
    row[: len(ids)] = ids
    return row


def _list_folder(folder: Path, key: str, tokenizer: Tokenizer, length: int) -> tuple[TextFiles, list[str]]:
    paths, labels, classes = folder_files(folder, key)
    return TextFiles(np.array(paths), np.array(labels, np.int32), tokenizer, length), classes


def folder_texts(folder: Path, key: str) -> tuple[list[str], list[int], list[str]]:
    """A text folder's texts and their class indices, by class, then by path (the samples' order), and the class
    names.

    Raises:
        DataError: see :func:`folder_files`.
    """
    paths, labels, classes = folder_files(folder, key)
    return [read_text(Path(path), key) for path in paths], labels, classes


def folder_files(folder: Path, key: str) -> tuple[list[str], list[int], list[str]]:
    """A text folder's files and their class indices, by class, then by path (the samples' order), and the class
    names. Each file is read once, to refuse a bad one before the run starts, and let go: no text is kept.

    Raises:
        DataError: under ``key``, the folder is missing, has fewer than two classes, a class without text files,
            or a file that is empty or not UTF-8.
    """
    if not folder.is_dir():
        raise DataError(key, "folder not found" if not folder.exists() else "is not a folder", str(folder))
    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if len(classes) < 2:
        held = f"one class ({classes[0]})" if classes else "no class subfolders"
        raise DataError(key, f"holds {held}; text classification needs one subfolder per class, at least two")
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = sorted((folder / name).rglob("*.txt"))
        if not files:
            raise DataError(key, f"class folder {name}/ holds no .txt files", str(folder))
        for path in files:
            read_text(path, key)
            paths.append(str(path))
            labels.append(label)
    return paths, labels, classes


def read_text(path: Path, key: str) -> str:
    """A file's UTF-8 text.

    Raises:
        DataError: under ``key``, the file is not UTF-8 or is empty.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(key, f"{path} is not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise DataError(key, f"cannot read {path}: {error.strerror}") from None
    if not text:
        raise DataError(key, f"{path} is empty")
    return text
