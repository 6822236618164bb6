"""Tokenizers: text to int32 token ids and back, on the host (NumPy) and as TensorFlow ops (so an exported SavedModel
takes strings), with the same ids; id 0 pads. ``word_piece``, ``sentence_piece`` and ``preset`` need the ``text``
extra (KerasHub, tensorflow-text, sentencepiece).
TensorFlow is imported only inside :meth:`Tokenizer.encode_tensor`, so the sources that tokenize stay free of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accumrun.core.tokens import PADDING_ID
from accumrun.data.section import DataSection
from accumrun.data.sentence_piece import import_sentencepiece, import_tensorflow_text
from accumrun.data.tokenizer_sections import (
    PresetTokenizerConfig,
    SentencePieceTokenizerConfig,
    TokenizerConfig,
    WordPieceTokenizerConfig,
)
from accumrun.errors import ConfigError
from accumrun.lookup import import_keras_hub

if TYPE_CHECKING:
    import tensorflow as tf


class Tokenizer(ABC):
    """Text to ``length`` int32 token ids (cut, or padded with 0) and ids back to text."""

    vocabulary_size: int
    """How many ids there are, padding's 0 among them: what an embedding needs."""
    line_local: bool = True
    """Whether no token spans a line break, so a text's ids are its lines' ids concatenated (how a corpus too big for
    memory is tokenized: :mod:`accumrun.data.corpus`)."""
    loader_imports: tuple[str, ...] = ()
    """The modules a process must import before it loads a SavedModel that holds :meth:`encode_tensor`'s ops (those
    that TensorFlow itself lacks)."""

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
        """The text of token ids, padding skipped; an id outside the vocabulary is a ValueError."""

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

        # decode_raw pads with zero bytes, which are real bytes too: a mask of each text's own bytes tells them apart.
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
        ids = tf.ragged.map_flat_values(tf.where, shifted < self.vocabulary_size, shifted, self.UNKNOWN)
        return tf.cast(ids, tf.int32).to_tensor(default_value=PADDING_ID, shape=[None, length])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return "".join("\ufffd" if i == self.UNKNOWN else chr(i - self._OFFSET) for i in self._checked(ids))


class KerasHubTokenizer(Tokenizer):
    """A KerasHub tokenizer (WordPiece, or a preset's), TensorFlow ops already (tensorflow-text), so the host and
    the graph encode alike. Its id 0 must pad: else a ConfigError under ``key`` names ``source`` (or the token)."""

    # tensorflow-text's ops (RegexSplitWithOffsets, NormalizeUTF8, SentencepieceOp, ...) are registered by importing
    # it. TensorFlow's own ops have no Unicode normalization and no SentencePiece segmentation to stand in for them.
    loader_imports = ("tensorflow_text",)

    def __init__(self, tokenizer: Any, line_local: bool, key: str, source: str | None) -> None:
        first = tokenizer.id_to_token(PADDING_ID)
        if first not in ("[PAD]", "<pad>", "<PAD>", getattr(tokenizer, "pad_token", None)):
            what = f"its id 0 is {first!r}, a real token; accumrun pads with id 0: put the padding token ([PAD]) first"
            raise ConfigError(key, what, source if source is not None else first)
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


class SentencePieceTokenizer(Tokenizer):
    """A learned SentencePiece model (:mod:`accumrun.data.sentence_piece`): the ``sentencepiece`` package on the
    host, tensorflow-text's op in a graph, with the same ids; decoding gives the text back byte for byte. The line
    break is a piece that no other contains, so a text's ids are its lines' ids (``line_local``)."""

    loader_imports = ("tensorflow_text",)

    def __init__(self, model: bytes) -> None:
        self._model = model
        self._pieces = import_sentencepiece().SentencePieceProcessor(model_proto=model)
        self.vocabulary_size = int(self._pieces.get_piece_size())

    def ids(self, text: str) -> np.ndarray:
        return np.asarray(self._pieces.encode(text), np.int32).reshape(-1)

    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        import tensorflow as tf

        # Made at each call, in the caller's graph, never kept: tensorflow-text's model belongs to the kernel that
        # reads it, and TensorFlow drops its eager kernels whenever a seed is set (keras.utils.set_random_seed), so
        # an input pipeline given a model read eagerly once would later find it gone.
        ids = import_tensorflow_text().SentencepieceTokenizer(model=self._model).tokenize(texts)
        return tf.cast(ids[:, :length], tf.int32).to_tensor(default_value=PADDING_ID, shape=[None, length])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        # Bytes cut mid-character (a generation that stopped there) decode as U+FFFD, one per byte.
        return str(self._pieces.decode(self._checked(ids).tolist()))


def tokenizer_for(config: TokenizerConfig) -> Tokenizer:
    """The tokenizer that ``data.tokenizer`` names; a ConfigError names a vocabulary file or preset folder that is
    missing, holds no tokenizer or whose id 0 is a real token, or KerasHub's extra when it is not installed."""
    return _TOKENIZERS[config.name](config)


def _word_piece(config: WordPieceTokenizerConfig) -> Tokenizer:
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
    try:
        tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, lowercase=config.lowercase)
    except (RuntimeError, ValueError) as error:  # tensorflow-text refuses a repeated token, say
        raise ConfigError(key, f"{source} cannot be read: {' '.join(str(error).split())}") from None
    # WordPiece splits at whitespace before it looks up pieces: its tokens never span a line break.
    return KerasHubTokenizer(tokenizer, True, key, None if config.learned else source)


def _sentence_piece(config: SentencePieceTokenizerConfig) -> Tokenizer:
    """The SentencePiece model that accumrun.data.vocabulary settled (learned, or the run's)."""
    if config.model is None:
        raise ValueError("a learned SentencePiece model is read only after accumrun.data.vocabulary settles it")
    return SentencePieceTokenizer(config.model)


def _preset(config: PresetTokenizerConfig) -> Tokenizer:
    """The tokenizer of a KerasHub preset folder."""
    key, source = "data.tokenizer.path", Path(config.path)
    keras_hub = import_keras_hub(key)
    if not (source / "tokenizer.json").is_file():
        where = "folder not found" if not source.is_dir() else "holds no KerasHub tokenizer (tokenizer.json)"
        raise ConfigError(key, where, str(source))
    try:
        tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(str(source))
    except (ValueError, OSError, TypeError) as error:
        raise ConfigError(key, f"cannot be loaded: {' '.join(str(error).split())}") from None
    # A preset's tokenizer (a BPE) may merge across lines.
    return KerasHubTokenizer(tokenizer, False, key, str(source))


_TOKENIZERS: dict[str, Callable[[Any], Tokenizer]] = {
    "byte": lambda config: ByteTokenizer(),
    "character": lambda config: CharacterTokenizer(config.vocabulary_size),
    "word_piece": _word_piece,
    "sentence_piece": _sentence_piece,
    "preset": _preset,
}
"""The tokenizer of each ``data.tokenizer.name`` (the schema refuses any other), from its section."""


def text_input(config: DataSection) -> tuple[Tokenizer, int] | None:
    """The tokenizer and sequence length of a source whose samples are text; None for any other."""
    settings = config.text_settings
    return None if settings is None else (tokenizer_for(settings[0]), settings[1])
