"""``data.name: tokens``: a flat binary file of token ids, as nanoGPT's ``train.bin`` and ``val.bin`` hold them.

The file's ids run from 0 to ``vocabulary_size - 1``, little-endian ``uint16`` (``data.dtype``'s default) or
``uint32``, and 0 is a real token (``!`` in GPT-2's vocabulary). accumrun's id 0 is padding, so every id is shifted
up by one as it is read, and the model's embedding has ``vocabulary_size + 1`` ids. A file of raw byte values
(``vocabulary_size: 256``) therefore holds the byte tokenizer's ids, and trains exactly as ``text_corpus`` does on the
same bytes.

The windows are ``text_corpus``'s (:func:`~accumrun.data.corpus.window_starts`: ``sequence_length + 1`` tokens every
``stride``) over the one file, read as the epoch's order reaches them (:class:`~accumrun.data.corpus.CorpusWindows`):
the file is never loaded whole. At load, its size and its ids are checked, a block at a time, so a file that is not
what the config says fails at once, naming it, rather than inside an epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from accumrun.data.corpus import CorpusWindows, window_starts
from accumrun.data.section import DEFAULT_SEQUENCE_LENGTH, FileSourceConfig, refuse_image_keys
from accumrun.data.splits import Splits
from accumrun.data.tokenizer_sections import TokenizerConfig
from accumrun.data.tokenizers import tokenizer_for
from accumrun.errors import ConfigError, DataError
from accumrun.kinds import Task


class TokensConfig(FileSourceConfig):
    """``name: tokens``: a flat binary file of token ids (nanoGPT's ``train.bin``), ids 0 to ``vocabulary_size - 1``,
    cut into windows as ``text_corpus`` cuts its texts (see :mod:`accumrun.data.tokens`)."""

    needs = {
        "path": "a flat binary file of token ids, such as nanoGPT's train.bin",
        "vocabulary_size": "how many ids the file's vocabulary has (every id is below it)",
    }
    name: Literal["tokens"]
    dtype: Literal["uint16", "uint32"] = "uint16"
    """How each id is stored: little-endian ``uint16`` (nanoGPT's), or ``uint32`` for a larger vocabulary."""
    vocabulary_size: int = Field(ge=1)
    """The file's vocabulary; the model's embedding gets one id more, accumrun's padding id 0."""
    sequence_length: int = Field(DEFAULT_SEQUENCE_LENGTH, ge=1)
    stride: int | None = Field(None, ge=1)
    """Tokens between the starts of two windows; unset, ``sequence_length`` (windows that do not overlap)."""
    tokenizer: TokenizerConfig | None = None
    """For decoding only (``generate``): the tokenizer whose ids are the file's shifted up by one (its 0 pads), so
    of ``vocabulary_size + 1`` ids."""

    @model_validator(mode="after")
    def _no_image_keys(self) -> TokensConfig:
        refuse_image_keys(self)
        if getattr(self.tokenizer, "learned", False):
            raise ValueError(
                "tokenizer: the file is tokenized already; a tokenizer here only decodes, so it needs its vocabulary "
                "(a file or a preset), not a size to learn"
            )
        return self

    @property
    def window_stride(self) -> int:
        """``stride``, or ``sequence_length`` when it is unset."""
        return self.stride if self.stride is not None else self.sequence_length

    @property
    def text_settings(self) -> tuple[TokenizerConfig, int] | None:
        return None if self.tokenizer is None else (self.tokenizer, self.sequence_length)


CHECK_BLOCK = 1 << 22
"""Ids checked against the vocabulary at once: 8 MiB of uint16, so the check's memory does not grow with the file."""


def load_tokens(config: TokensConfig, seed: int) -> Splits:
    """The windows of ``data.path`` (and of ``data.validation_path``), each file checked first.

    Raises:
        DataError: a file is missing, empty, not a whole number of ids, shorter than one window, or holds an id at
            or above ``vocabulary_size``.
        ConfigError: ``data.tokenizer`` has not ``vocabulary_size + 1`` ids, so it would not decode the file's.
    """
    if config.tokenizer is not None:
        ids = tokenizer_for(config.tokenizer).vocabulary_size
        if ids != config.vocabulary_size + 1:
            raise ConfigError(
                "data.tokenizer",
                f"has {ids:,} ids with padding; a file of data.vocabulary_size {config.vocabulary_size:,} is decoded "
                f"by one of {config.vocabulary_size + 1:,}",
                config.tokenizer.name,
            )
    train = token_windows(config, config.path, "data.path")
    test = token_windows(config, config.validation_path, "data.validation_path") if config.validation_path else None
    return Splits(train, test, vocabulary_size=config.vocabulary_size + 1, task=Task.CAUSAL_LM)


def token_windows(config: TokensConfig, path: str, key: str) -> CorpusWindows:
    """The windows of the token file ``path``, whose ids are checked (see :func:`checked_count`)."""
    stored = np.dtype(config.dtype).newbyteorder("<")
    count = checked_count(Path(path), key, stored, config.vocabulary_size, config.sequence_length)
    begins = window_starts(count, config.sequence_length, config.window_stride)
    ends = np.full(len(begins), count, np.int64)
    return CorpusWindows(path, begins, ends, config.sequence_length, stored=stored.str, shift=1)


def checked_count(path: Path, key: str, stored: np.dtype, vocabulary_size: int, length: int) -> int:
    """How many ids the file holds, once it is known to hold whole ids, at least one window of them, and none at or
    above ``vocabulary_size``.

    Raises:
        DataError: under ``key``, naming the file and what is wrong with it.
    """
    if not path.is_file():
        raise DataError(key, "token file not found", str(path))
    size = path.stat().st_size
    if size == 0:
        raise DataError(key, f"{path} is empty")
    if size % stored.itemsize:
        raise DataError(
            key,
            f"{path} holds {size:,} bytes, not a whole number of {stored.name} ids of {stored.itemsize} bytes "
            "(check data.dtype)",
        )
    count = size // stored.itemsize
    if count < length + 1:
        raise DataError(
            key,
            f"{path} holds {count:,} tokens, fewer than one window of sequence_length + 1 = {length + 1:,} (a window "
            "and its next token)",
        )
    _check_ids(path, key, stored, vocabulary_size)
    return count


def _check_ids(path: Path, key: str, stored: np.dtype, vocabulary_size: int) -> None:
    with path.open("rb") as file:
        start = 0
        while block := file.read(CHECK_BLOCK * stored.itemsize):
            ids = np.frombuffer(block, stored)
            if int(ids.max()) >= vocabulary_size:
                at = int(np.argmax(ids >= vocabulary_size))
                raise DataError(
                    key,
                    f"{path}: token {start + at:,} is id {int(ids[at]):,}, not below data.vocabulary_size "
                    f"{vocabulary_size:,}",
                )
            start += len(ids)
