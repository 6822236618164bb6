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

import numpy as np

from accumrun.config.schema import CsvConfig, TextCorpusConfig, TextFolderConfig
from accumrun.data.corpus import CorpusWindows, corpus_windows, window_starts
from accumrun.data.splits import ArraySplit, Splits, TextFiles
from accumrun.data.tokenizers import Tokenizer, text_input, tokenizer_for
from accumrun.errors import DataError
from accumrun.kinds import CacheMode, Task


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

    @classmethod
    def of(cls, config: CsvConfig) -> TextColumn | None:
        """The CSV's text column, or None for a table of numbers."""
        text = text_input(config)
        if config.text is None or text is None:
            return None
        return cls(config.text, *text, stream=config.cache is CacheMode.NONE)

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
