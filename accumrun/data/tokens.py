"""``data.name: tokens``: a flat file of little-endian uint16 or uint32 token ids, as nanoGPT's ``train.bin``.

The file's 0 is a real token, but accumrun's 0 is padding, so every id is shifted up by one as it is read and the
model has ``vocabulary_size + 1`` ids: a file of raw bytes (``vocabulary_size: 256``) trains exactly as
``text_corpus`` does on the same bytes. The windows are ``text_corpus``'s, read as the epoch reaches them
(:class:`~accumrun.data.corpus.CorpusWindows`); the file is checked a block at a time at load, never held whole.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from accumrun.data.corpus import CorpusWindows
from accumrun.data.section import DEFAULT_SEQUENCE_LENGTH, FileSourceConfig, refuse_image_keys
from accumrun.data.splits import Splits
from accumrun.data.tokenizers import TokenizerConfig, tokenizer_for
from accumrun.errors import ConfigError, DataError
from accumrun.kinds import Task

CHECK_BLOCK = 1 << 20
"""Ids checked against the vocabulary at once: 2 MiB of uint16, so the check's memory does not grow with the file."""


class TokensConfig(FileSourceConfig):
    """``name: tokens``: a flat file of token ids 0 to ``vocabulary_size - 1`` (see the module's description)."""

    needs = {
        "path": "a flat binary file of token ids, such as nanoGPT's train.bin",
        "vocabulary_size": "how many ids the file's vocabulary has (every id is below it)",
    }
    name: Literal["tokens"]
    dtype: Literal["uint16", "uint32"] = "uint16"
    vocabulary_size: int = Field(ge=1)
    """The file's vocabulary; the model's embedding gets one id more, accumrun's padding id 0."""
    sequence_length: int = Field(DEFAULT_SEQUENCE_LENGTH, ge=1)
    stride: int | None = Field(None, ge=1)
    """Tokens between the starts of two windows; unset, ``sequence_length`` (windows that do not overlap)."""
    tokenizer: TokenizerConfig | None = None
    """For decoding only (``generate``): a tokenizer of ``vocabulary_size + 1`` ids, the file's shifted by one."""

    @model_validator(mode="after")
    def _no_image_keys(self) -> TokensConfig:
        refuse_image_keys(self)
        if getattr(self.tokenizer, "learned", False):
            raise ValueError(
                "tokenizer: the file is tokenized already; a tokenizer here only decodes, so it needs its vocabulary "
                "(a file or a preset), not a size to learn"
            )
        return self


def load_tokens(config: TokensConfig, seed: int) -> Splits:
    """The windows of ``data.path`` (and of ``data.validation_path``), each file checked first; ConfigError where
    ``data.tokenizer`` has not ``vocabulary_size + 1`` ids, so it would not decode the file's."""
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
    """The windows of the token file ``path``, once it is known to hold whole ids, at least one window of them,
    and none at or above ``vocabulary_size`` (else a DataError under ``key`` says what is wrong)."""
    file = Path(path)
    stored = np.dtype(config.dtype).newbyteorder("<")
    length = config.sequence_length
    if not file.is_file():
        raise DataError(key, "token file not found", str(file))
    size = file.stat().st_size
    if size == 0:
        raise DataError(key, f"{file} is empty")
    if size % stored.itemsize:
        raise DataError(
            key,
            f"{file} holds {size:,} bytes, not a whole number of {stored.name} ids of {stored.itemsize} bytes "
            "(check data.dtype)",
        )
    count = size // stored.itemsize
    if count < length + 1:
        raise DataError(
            key,
            f"{file} holds {count:,} tokens, fewer than one window of sequence_length + 1 = {length + 1:,} (a window "
            "and its next token)",
        )
    with file.open("rb") as reader:
        for start in range(0, count, CHECK_BLOCK):
            ids = np.fromfile(reader, stored, CHECK_BLOCK)
            if int(ids.max()) >= config.vocabulary_size:
                at = int(np.argmax(ids >= config.vocabulary_size))
                raise DataError(
                    key,
                    f"{file}: token {start + at:,} is id {int(ids[at]):,}, not below data.vocabulary_size "
                    f"{config.vocabulary_size:,}",
                )
    windows = CorpusWindows.over(path, np.array([count]), length, config.stride or length)
    return replace(windows, stored=stored.str, shift=1)
