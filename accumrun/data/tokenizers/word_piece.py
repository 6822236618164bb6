"""``data.tokenizer: {name: word_piece}``: KerasHub's WordPiece over a vocabulary file, or over a vocabulary learned
from the training texts and kept in the run's ``tokenizer/vocabulary.txt``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from accumrun.data.tokenizers.base import Learning, Tokenizer, TokenizerSection
from accumrun.data.tokenizers.hub import KerasHubTokenizer
from accumrun.errors import ConfigError
from accumrun.lookup import import_keras_hub
from accumrun.rundir.layout import VOCABULARY_FILE, read_vocabulary, write_vocabulary
from accumrun.sections import Flag


class WordPieceTokenizerConfig(TokenizerSection):
    """``tokenizer: {name: word_piece, vocabulary: FILE}``: KerasHub's WordPiece over a vocabulary file, one token
    per line, the first padding (id 0); or ``vocabulary_size: N``: at most N tokens learned from the training texts
    and saved in the run folder (:mod:`accumrun.data.vocabulary`)."""

    keras_hub = True
    name: Literal["word_piece"]
    vocabulary: str | None = Field(None, min_length=1)
    # Below about 100 learned ids, the learner cuts single characters (with and without ##): text becomes unknowns.
    vocabulary_size: int | None = Field(None, ge=100)
    lowercase: Flag = True
    _tokens: tuple[str, ...] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _one_vocabulary(self) -> WordPieceTokenizerConfig:
        if (self.vocabulary is None) == (self.vocabulary_size is None):
            what = "set one of vocabulary (a file) and vocabulary_size (learned from the training texts)"
            raise ValueError(what + (", not both" if self.vocabulary is not None else ""))
        return self

    @property
    def learns_at_most(self) -> int | None:
        """``vocabulary_size``, where the vocabulary is learned from the training texts, not read from a file."""
        return self.vocabulary_size

    @property
    def tokens(self) -> tuple[str, ...] | None:
        """A learned vocabulary's tokens, once ``settle_vocabulary`` (:mod:`accumrun.data.vocabulary`) settles them."""
        return self._tokens

    def with_tokens(self, tokens: tuple[str, ...]) -> WordPieceTokenizerConfig:
        """This section with its learned vocabulary's ``tokens`` settled."""
        settled = self.model_copy()
        settled._tokens = tokens
        return settled

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        identity: dict[str, object] = {"name": self.name, "lowercase": self.lowercase}
        if self.tokens is not None:
            identity["tokens"] = hashlib.sha256("\n".join(self.tokens).encode()).hexdigest()
        else:
            assert self.vocabulary is not None  # the schema takes one of the two
            identity["vocabulary"] = file_hash(Path(self.vocabulary))
        return identity


def build_word_piece(config: WordPieceTokenizerConfig) -> Tokenizer:
    """KerasHub's WordPiece over a vocabulary file or a learned vocabulary's tokens."""
    vocabulary: str | list[str]
    if config.learned:
        # accumrun.data.vocabulary settles the tokens before any data is read: a tokenizer never learns on its own,
        # from texts that could be validation texts or no longer the run's.
        if config.tokens is None:
            raise ValueError("a learned vocabulary is read only after accumrun.data.vocabulary settles it")
        key, source, vocabulary = "data.tokenizer.vocabulary_size", "the learned vocabulary", list(config.tokens)
    else:
        assert config.vocabulary is not None  # the schema takes one of the two
        key = "data.tokenizer.vocabulary"
        source = vocabulary = str(Path(config.vocabulary))
    keras_hub = import_keras_hub(key)
    if not config.learned and not Path(source).is_file():
        raise ConfigError(key, "vocabulary file not found", source)
    if not config.learned and "[UNK]" not in Path(source).read_text(encoding="utf-8", errors="replace").split("\n"):
        # KerasHub's own words name an argument that accumrun's config does not have.
        what = "has no [UNK] line, the token for a word WordPiece cannot cut; add it after [PAD], the first line"
        raise ConfigError(key, f"{source} {what}")
    try:
        tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, lowercase=config.lowercase)
    except (RuntimeError, ValueError) as error:  # tensorflow-text refuses a repeated token, say
        raise ConfigError(key, f"{source} cannot be read: {' '.join(str(error).split())}") from None
    # WordPiece splits at whitespace before it looks up pieces: its tokens never span a line break.
    return KerasHubTokenizer(tokenizer, True, key, None if config.learned else source)


def learn_vocabulary(texts: list[str], config: WordPieceTokenizerConfig) -> tuple[str, ...]:
    """A WordPiece vocabulary of at most ``config.vocabulary_size`` tokens learned from ``texts`` by KerasHub."""
    assert config.vocabulary_size is not None
    keras_hub = import_keras_hub("data.tokenizer")
    import tensorflow as tf

    tokens = keras_hub.tokenizers.compute_word_piece_vocabulary(
        tf.data.Dataset.from_tensor_slices(texts),
        config.vocabulary_size,
        lowercase=config.lowercase,
        reserved_tokens=["[PAD]", "[UNK]"],  # padding (id 0) first, then KerasHub WordPiece's oov_token
    )
    return tuple(str(token) for token in tokens)


WORD_PIECE_LEARNING: Learning[WordPieceTokenizerConfig, tuple[str, ...]] = Learning(
    VOCABULARY_FILE,
    "vocabulary",
    learn=learn_vocabulary,
    settle=WordPieceTokenizerConfig.with_tokens,
    settled=lambda config: config.tokens,
    read=read_vocabulary,
    write=write_vocabulary,
    size=len,
)
"""A ``vocabulary_size`` learns its tokens from the training texts, kept in the run's ``tokenizer/vocabulary.txt``."""
