"""Text sources, tokenized to ``sequence_length`` int32 token ids (cut, or padded with id 0, which the models mask):
``text_folder``, one subfolder of ``.txt`` files per class, and ``text_corpus``, ``.txt`` files for a language model.

A corpus is cut file by file into windows of ``sequence_length + 1`` tokens, ``stride`` apart: the first
``sequence_length`` are the sample, the last ``sequence_length`` its next-token targets. A file's last window may be
short; its padding is no target, so the loss counts only real tokens.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from accumrun.data.corpus import CorpusWindows, read_text, token_file
from accumrun.data.files import TextFiles
from accumrun.data.section import DEFAULT_SEQUENCE_LENGTH, FileSourceConfig, none_or_memory, refuse_image_keys
from accumrun.data.source import ArraySource
from accumrun.data.splits import Splits
from accumrun.data.tokenizers import TokenizerConfig, tokenizer_for
from accumrun.data.tokenizers.byte import ByteTokenizerConfig
from accumrun.errors import DataError
from accumrun.kinds import CacheMode, Task
from accumrun.sections import words


class TextSourceConfig(FileSourceConfig):
    """A source of UTF-8 text, each sample tokenized to ``sequence_length`` token ids."""

    tokenizer: TokenizerConfig = Field(default_factory=lambda: ByteTokenizerConfig(name="byte"))
    sequence_length: int = Field(DEFAULT_SEQUENCE_LENGTH, ge=1)
    """Tokens per sample: a longer text is cut, a shorter one padded with id 0."""
    bucket: int | None = Field(None, ge=1)
    """Pad each training sub-batch only to its longest text, rounded up to a multiple of this, each batch sorted by
    length first (:mod:`accumrun.data.grouping`): the same update, as padding is masked, but other dropout masks."""

    @model_validator(mode="after")
    def _no_image_keys(self) -> TextSourceConfig:
        refuse_image_keys(self)
        return self


class TextFolderConfig(TextSourceConfig):
    """``name: text_folder``: one subfolder of UTF-8 ``.txt`` files per class."""

    needs = {"path": "a folder with one subfolder of .txt files per class"}
    labelled_files = True
    name: Literal["text_folder"]
    cache: Annotated[CacheMode, words(CacheMode), none_or_memory("text_folder", "files")] = CacheMode.NONE
    """``none`` streams each file as the epoch reaches it; ``memory`` tokenizes each split at load (faster)."""

    @property
    def cache_wrapper(self) -> tuple[CacheMode, str]:
        return self.cache, ""


class TextCorpusConfig(TextSourceConfig):
    """``name: text_corpus``: ``.txt`` files (a file, a folder, or a glob) cut into windows for a language model."""

    needs = {"path": "a .txt file, a folder of .txt files, or a glob of them"}
    stride: int | None = Field(None, ge=1)
    """Tokens between the starts of two windows; unset, ``sequence_length`` (windows that do not overlap)."""
    cache: Annotated[CacheMode, words(CacheMode)] = CacheMode.MEMORY
    """``memory`` holds the windows in memory; ``none`` holds the token ids and cuts each window from them as it is
    read (the same windows); ``disk`` reads them from a reusable token file under ``cache_dir``."""
    cache_dir: str = Field("~/.cache/accumrun/", min_length=1)
    """Where ``cache: disk`` writes (``~`` is expanded): a folder per corpus, named by its files and tokenizer."""


def load_text_folder(config: TextFolderConfig, seed: int) -> Splits:
    """The checked ``.txt`` files under ``data.path`` (and ``data.validation_path``, with the same classes)."""
    tokenizer = tokenizer_for(config.tokenizer)

    def listed(folder: str, key: str) -> tuple[TextFiles, list[str]]:
        paths, labels, classes = folder_files(Path(folder), key)
        return TextFiles(np.array(paths), np.array(labels, np.int32), tokenizer, config.sequence_length), classes

    train, names = listed(config.path, "data.path")
    test = None
    if config.validation_path:
        test, val_names = listed(config.validation_path, "data.validation_path")
        if val_names != names:
            what = f"has classes {', '.join(val_names)}, data.path has {', '.join(names)}; they must be the same"
            raise DataError("data.validation_path", what, config.validation_path)
    return Splits(train, test, class_names=names, vocabulary_size=tokenizer.vocabulary_size)


def load_text_corpus(config: TextCorpusConfig, seed: int) -> Splits:
    """The windows of the ``.txt`` files that ``data.path`` (and ``data.validation_path``) names, in sorted order;
    no file, a bad file, or no file of two tokens (the least a window with a target needs) is a DataError."""
    tokenizer = tokenizer_for(config.tokenizer)
    length, stride = config.sequence_length, config.stride or config.sequence_length

    def windows(path: str, key: str) -> tuple[ArraySource | CorpusWindows, int]:
        """The windows of ``path``'s files, and how many tokens those hold."""
        files = corpus_files(path, key)
        split: ArraySource | CorpusWindows
        if config.cache is CacheMode.DISK:
            tokens = token_file(files, key, tokenizer, config.tokenizer, config.cache_dir)
            split = CorpusWindows.over(str(tokens.path), tokens.ends, length, stride)
            count = int(tokens.ends[-1])
        else:
            ids = [tokenizer.ids(read_text(file, key)) for file in files]
            ends = np.cumsum([len(text) for text in ids])
            cut, joined = CorpusWindows.over("", ends, length, stride), np.concatenate(ids)
            split = cut.as_arrays(joined) if config.cache is CacheMode.MEMORY else cut.holding(joined)
            count = int(ends[-1])
        if not split.size:
            raise DataError(key, "holds no text of two tokens or more, the least a next-token target needs", path)
        return split, count

    train, count = windows(config.path, "data.path")
    fraction = 0.0 if config.validation_path else config.validation_split
    if isinstance(fraction, float) and fraction and not round(train.size * fraction) and count < length + 1:
        # The split would hold out no window of a text this short; the window is what to name, not the split.
        what = (
            f"the text is shorter than one window: {count:,} tokens, and a window takes data.sequence_length + 1 = "
            f"{length + 1:,} (its tokens and the next one)"
        )
        raise DataError("data.path", what, config.path)
    test = windows(config.validation_path, "data.validation_path")[0] if config.validation_path else None
    return Splits(train, test, vocabulary_size=tokenizer.vocabulary_size, task=Task.CAUSAL_LM)


def corpus_files(path: str, key: str) -> list[Path]:
    """The ``.txt`` files ``path`` names, sorted: the file itself, those under a folder, or a glob's (at least one)."""
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


def folder_files(folder: Path, key: str) -> tuple[list[str], list[int], list[str]]:
    """A text folder's files and their class indices, by class, then by path, and the class names. Each file is
    read once, to refuse a bad one before the run starts, and let go; a DataError under ``key`` names a missing
    folder, fewer than two classes, a class without text files, or a file that is empty or not UTF-8."""
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
