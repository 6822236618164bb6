"""Text sources: ``text_folder`` (one subfolder of ``.txt`` files per class), and the text column of a table (a
CSV's ``data.text``, a JSON Lines file's key), tokenized to int32 token ids.

Tokens are int32, ``sequence_length`` of them per sample: a longer text is cut there, a shorter one padded with
id 0, which the models mask. ``data.tokenizer`` picks the tokenizer (:mod:`accumrun.data.tokenizers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accumrun.config.schema import CsvConfig, TextFolderConfig
from accumrun.data.splits import ArraySplit, Splits
from accumrun.data.tokenizers import Tokenizer, text_input, tokenizer_for
from accumrun.errors import DataError


def load_text_folder(config: TextFolderConfig, seed: int) -> Splits:
    """The ``.txt`` files under ``data.path`` (and ``data.validation_path``, with the same classes), tokenized,
    in a stable order: by class, then by path.

    Raises:
        DataError: a folder is missing, has fewer than two classes, a class without text files, or a file that
            is empty or not UTF-8; or the two folders' classes differ.
    """
    tokenizer = tokenizer_for(config.tokenizer)
    train, names = _read_folder(Path(config.path), "data.path", tokenizer, config.sequence_length)
    test = None
    if config.validation_path:
        test, val_names = _read_folder(
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
    """A table's text column (``data.text``) and how its cells become ``length`` token ids."""

    column: str
    tokenizer: Tokenizer
    length: int

    @classmethod
    def of(cls, config: CsvConfig) -> TextColumn | None:
        """The CSV's text column, or None for a table of numbers."""
        text = text_input(config)
        if config.text is None or text is None:
            return None
        return cls(config.text, *text)

    def tokens(self, path: Path, cells: Sequence[str], lines: Sequence[int]) -> np.ndarray:
        """The cells' token ids, one row each.

        Raises:
            DataError: under ``data.text``, a cell is empty (named by the file and its line number).
        """
        for cell, line in zip(cells, lines, strict=True):
            if not cell:
                raise DataError("data.text", f"{path}, line {line}: the text in column {self.column!r} is empty")
        return self.tokenizer.encode(cells, self.length)


def _read_folder(folder: Path, key: str, tokenizer: Tokenizer, length: int) -> tuple[ArraySplit, list[str]]:
    if not folder.is_dir():
        raise DataError(key, "folder not found" if not folder.exists() else "is not a folder", str(folder))
    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if len(classes) < 2:
        held = f"one class ({classes[0]})" if classes else "no class subfolders"
        raise DataError(key, f"holds {held}; text classification needs one subfolder per class, at least two")
    texts, labels = [], []
    for label, name in enumerate(classes):
        files = sorted((folder / name).rglob("*.txt"))
        if not files:
            raise DataError(key, f"class folder {name}/ holds no .txt files", str(folder))
        for path in files:
            texts.append(read_text(path, key))
            labels.append(label)
    return ArraySplit(tokenizer.encode(texts, length), np.array(labels, np.int32)), classes


def read_text(path: Path, key: str) -> str:
    """A file's UTF-8 text.

    Raises:
        DataError: under ``key``, the file is not UTF-8 or is empty.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(key, f"{path} is not UTF-8 text (byte {error.start})") from None
    if not text:
        raise DataError(key, f"{path} is empty")
    return text
