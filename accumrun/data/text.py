"""Text sources: ``text_folder`` (one subfolder of ``.txt`` files per class), tokenized to int32 token ids.

Tokens are int32, ``sequence_length`` of them per sample: a longer text is cut there, a shorter one padded with
id 0, which the models mask. The ``byte`` tokenizer needs no vocabulary: token ``b + 1`` is the UTF-8 byte ``b``,
so there are :data:`BYTE_VOCABULARY` ids in all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from accumrun.config.schema import TextFolderConfig
from accumrun.data.splits import ArraySplit, Splits
from accumrun.errors import DataError

BYTE_VOCABULARY = 257
"""The byte tokenizer's ids: 0 for padding, then one per byte value."""


def load_text_folder(config: TextFolderConfig, seed: int) -> Splits:
    """The ``.txt`` files under ``data.path`` (and ``data.validation_path``, with the same classes), tokenized,
    in a stable order: by class, then by path.

    Raises:
        DataError: a folder is missing, has fewer than two classes, a class without text files, or a file that
            is empty or not UTF-8; or the two folders' classes differ.
    """
    train, names = _read_folder(Path(config.path), "data.path", config.sequence_length)
    test = None
    if config.validation_path:
        test, val_names = _read_folder(Path(config.validation_path), "data.validation_path", config.sequence_length)
        if val_names != names:
            raise DataError(
                "data.validation_path",
                f"has classes {', '.join(val_names)}, data.path has {', '.join(names)}; they must be the same",
                config.validation_path,
            )
    return Splits(train, test, class_names=names, vocabulary_size=BYTE_VOCABULARY)


def byte_tokens(text: str, length: int) -> np.ndarray:
    """``text``'s UTF-8 bytes as token ids (byte + 1), cut or padded with 0 to ``length``."""
    ids = np.zeros(length, np.int32)
    encoded = np.frombuffer(text.encode("utf-8")[:length], np.uint8)
    ids[: len(encoded)] = encoded.astype(np.int32) + 1
    return ids


def _read_folder(folder: Path, key: str, length: int) -> tuple[ArraySplit, list[str]]:
    if not folder.is_dir():
        raise DataError(key, "folder not found" if not folder.exists() else "is not a folder", str(folder))
    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if len(classes) < 2:
        held = f"one class ({classes[0]})" if classes else "no class subfolders"
        raise DataError(key, f"holds {held}; text classification needs one subfolder per class, at least two")
    rows, labels = [], []
    for label, name in enumerate(classes):
        files = sorted((folder / name).rglob("*.txt"))
        if not files:
            raise DataError(key, f"class folder {name}/ holds no .txt files", str(folder))
        for path in files:
            rows.append(byte_tokens(read_text(path, key), length))
            labels.append(label)
    return ArraySplit(np.stack(rows), np.array(labels, np.int32)), classes


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
