"""Tokenizers: text to int32 token ids and back, on the host (NumPy) and in a TensorFlow graph, with the same ids.

Every tokenizer pads with id 0, which the models mask, and cuts a text longer than the length. The host
:meth:`Tokenizer.encode` makes the training samples and predict's inputs; :meth:`Tokenizer.encode_tensor` is the
same function as TensorFlow ops (``tf.strings``), so an exported SavedModel takes strings and needs no accumrun;
:meth:`Tokenizer.decode` turns ids back into text (for ``generate``):

- ``byte``: token ``b + 1`` for each UTF-8 byte ``b`` (257 ids);
- ``character``: token ``c + 2`` for each Unicode code point ``c`` below ``vocabulary_size - 2``, else 1, unknown;
- ``word_piece``: KerasHub's WordPiece over a vocabulary file whose first token pads, or over a vocabulary learned
  from the training texts (:mod:`accumrun.data.vocabulary` learns it, or reads it from the run folder, first);
- ``preset``: the tokenizer of a KerasHub preset folder, whose id 0 pads.

The last two need KerasHub (the ``text`` extra) and are TensorFlow ops themselves.
TensorFlow is imported inside :meth:`Tokenizer.encode_tensor` alone, so the sources that tokenize stay free of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accumrun.config.schema import (
    ByteTokenizerConfig,
    CharacterTokenizerConfig,
    CsvConfig,
    DataSection,
    PresetTokenizerConfig,
    TextSourceConfig,
    TokenizerConfig,
    WordPieceTokenizerConfig,
)
from accumrun.core.tokens import PADDING_ID
from accumrun.errors import ConfigError
from accumrun.lookup import import_keras_hub

if TYPE_CHECKING:
    import tensorflow as tf


class Tokenizer(ABC):
    """Text to ``length`` int32 token ids (cut, or padded with 0) and ids back to text."""

    vocabulary_size: int
    """How many ids there are, padding's 0 among them: what an embedding needs."""
    line_local: bool = True
    """Whether no token spans a line break, so that a text's ids are those of its lines' pieces, concatenated (a
    corpus too big for memory is tokenized so: :mod:`accumrun.data.corpus`)."""

    def encode(self, texts: Iterable[str], length: int) -> np.ndarray:
        """``texts`` as an int32 array ``[len(texts), length]``, each row cut or padded with 0."""
        rows = [self.ids(text)[:length] for text in texts]
        ids = np.zeros((len(rows), length), np.int32)
        for row, tokens in zip(ids, rows, strict=True):
            row[: len(tokens)] = tokens
        return ids

    @abstractmethod
    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        """What :meth:`encode` gives, as TensorFlow ops: a tf.string tensor ``[n]`` to int32 ``[n, length]``."""

    @abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of token ids, padding skipped.

        Raises:
            ValueError: an id outside the vocabulary.
        """

    @abstractmethod
    def ids(self, text: str) -> np.ndarray:
        """All of ``text``'s token ids, uncut and unpadded, as int32 (a corpus, a prompt)."""

    def _checked(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``ids`` without padding, refused when one is outside the vocabulary."""
        array = np.asarray(ids, dtype=np.int64).reshape(-1)
        outside = array[(array < 0) | (array >= self.vocabulary_size)]
        if len(outside):
            raise ValueError(f"token id {outside[0]} is outside the vocabulary of {self.vocabulary_size} ids")
        return array[array != PADDING_ID]


class ByteTokenizer(Tokenizer):
    """Each UTF-8 byte ``b`` is token ``b + 1``: 257 ids, no text is ever unknown."""

    vocabulary_size = 257

    def ids(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + 1

    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        import tensorflow as tf

        # decode_raw pads with zero bytes, which are real bytes too: the mask of each text's own bytes tells them
        # from padding.
        raw = tf.io.decode_raw(texts, tf.uint8, fixed_length=length)
        real = tf.sequence_mask(tf.minimum(tf.strings.length(texts), length), length)
        return tf.where(real, tf.cast(raw, tf.int32) + 1, PADDING_ID)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        # A cut can split a character's bytes: what is left of it becomes U+FFFD, as any lenient reader shows it.
        return bytes((self._checked(ids) - 1).astype(np.uint8)).decode("utf-8", errors="replace")


class CharacterTokenizer(Tokenizer):
    """Each Unicode code point ``c`` is token ``c + 2`` when that is below ``vocabulary_size``, else 1 (unknown)."""

    UNKNOWN = 1
    _OFFSET = 2  # ids 0 and 1 are padding and unknown

    def __init__(self, vocabulary_size: int) -> None:
        self.vocabulary_size = vocabulary_size

    def ids(self, text: str) -> np.ndarray:
        # UTF-32 holds one code point per 4 bytes, so this reads them all at once.
        points = np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.int64) + self._OFFSET
        return np.where(points < self.vocabulary_size, points, self.UNKNOWN).astype(np.int32)

    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        import tensorflow as tf

        # Bytes that are not UTF-8 (never in a Python string) become U+FFFD, id 65,535 or unknown below it.
        points = tf.strings.unicode_decode(texts, "UTF-8", errors="replace")[:, :length]
        shifted = tf.cast(points, tf.int64) + self._OFFSET
        ids = tf.ragged.map_flat_values(
            lambda values: tf.cast(tf.where(values < self.vocabulary_size, values, self.UNKNOWN), tf.int32), shifted
        )
        return ids.to_tensor(default_value=PADDING_ID, shape=[None, length])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return "".join("\ufffd" if i == self.UNKNOWN else chr(i - self._OFFSET) for i in self._checked(ids))


class KerasHubTokenizer(Tokenizer):
    """A KerasHub tokenizer (WordPiece over a vocabulary file, or a preset's), whose id 0 pads. It is TensorFlow
    ops already (tensorflow-text), so the host and the graph encode alike."""

    def __init__(self, tokenizer: Any, line_local: bool) -> None:
        self._tokenizer = tokenizer
        self.vocabulary_size = int(tokenizer.vocabulary_size())
        self.line_local = line_local

    def ids(self, text: str) -> np.ndarray:
        return np.asarray(self._tokenizer(text), np.int32).reshape(-1)

    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        import tensorflow as tf

        ids = self._tokenizer(texts)
        if not isinstance(ids, tf.RaggedTensor):  # called eagerly, KerasHub returns lists
            ids = tf.ragged.constant(ids, dtype=tf.int32, ragged_rank=1)
        return tf.cast(ids[:, :length], tf.int32).to_tensor(default_value=PADDING_ID, shape=[None, length])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        text = self._tokenizer.detokenize(self._checked(ids).astype(np.int32))
        return str(np.asarray(text).item().decode("utf-8") if hasattr(text, "numpy") else text)


def tokenizer_for(config: TokenizerConfig) -> Tokenizer:
    """The tokenizer that ``data.tokenizer`` names.

    Raises:
        ConfigError: a vocabulary file or preset folder that is missing, holds no tokenizer, or whose id 0 is a
            real token; KerasHub is not installed (the message names the extra).
    """
    if isinstance(config, CharacterTokenizerConfig):
        return CharacterTokenizer(config.vocabulary_size)
    if isinstance(config, WordPieceTokenizerConfig):
        if config.learned:
            # accumrun.data.vocabulary settles the tokens before any data is read: a tokenizer never learns on its own,
            # from texts that could be validation texts or no longer the run's.
            if config.tokens is None:
                raise ValueError("a learned vocabulary is read only after accumrun.data.vocabulary settles it")
            return _keras_hub_tokenizer(config, list(config.tokens), "data.tokenizer.vocabulary_size")
        assert config.vocabulary is not None  # the schema takes one of the two
        return _keras_hub_tokenizer(config, Path(config.vocabulary), "data.tokenizer.vocabulary")
    if isinstance(config, PresetTokenizerConfig):
        return _keras_hub_tokenizer(config, Path(config.path), "data.tokenizer.path")
    assert isinstance(config, ByteTokenizerConfig)  # the schema refuses any other name
    return ByteTokenizer()


def _keras_hub_tokenizer(
    config: WordPieceTokenizerConfig | PresetTokenizerConfig, source: Path | list[str], key: str
) -> Tokenizer:
    """KerasHub's tokenizer over a vocabulary file, a learned vocabulary's tokens (``source`` a list), or a preset
    folder."""
    keras_hub = import_keras_hub(key)
    if isinstance(config, WordPieceTokenizerConfig):
        if isinstance(source, Path) and not source.is_file():
            raise ConfigError(key, "vocabulary file not found", str(source))
        vocabulary = str(source) if isinstance(source, Path) else source
        try:
            tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, lowercase=config.lowercase)
        except (RuntimeError, ValueError) as error:  # tensorflow-text refuses a repeated token, say
            where = source if isinstance(source, Path) else "the learned vocabulary"
            raise ConfigError(key, f"{where} cannot be read: {' '.join(str(error).split())}") from None
    else:
        assert isinstance(source, Path)  # a preset is a folder
        if not (source / "tokenizer.json").is_file():
            where = "folder not found" if not source.is_dir() else "holds no KerasHub tokenizer (tokenizer.json)"
            raise ConfigError(key, where, str(source))
        try:
            tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(str(source))
        except (ValueError, OSError, TypeError) as error:
            raise ConfigError(key, f"cannot be loaded: {' '.join(str(error).split())}") from None
    first = tokenizer.id_to_token(PADDING_ID)
    if first not in ("[PAD]", "<pad>", "<PAD>", getattr(tokenizer, "pad_token", None)):
        raise ConfigError(
            key,
            f"its id 0 is {first!r}, a real token; accumrun pads with id 0: put the padding token ([PAD]) first",
            str(source) if isinstance(source, Path) else first,
        )
    # WordPiece splits at whitespace before it looks up pieces; a preset's tokenizer (a BPE) may merge across lines.
    return KerasHubTokenizer(tokenizer, line_local=isinstance(config, WordPieceTokenizerConfig))


def text_input(config: DataSection) -> tuple[Tokenizer, int] | None:
    """The tokenizer and sequence length of a source whose samples are text (a text source, or a CSV with
    ``data.text``); None for any other."""
    if isinstance(config, TextSourceConfig):
        return tokenizer_for(config.tokenizer), config.sequence_length
    if isinstance(config, CsvConfig) and config.text is not None:
        assert config.tokenizer is not None and config.sequence_length is not None  # filled in with data.text
        return tokenizer_for(config.tokenizer), config.sequence_length
    return None
