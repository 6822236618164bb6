"""``data.tokenizer: {name: character}``: each Unicode code point is a token, up to a vocabulary size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from accumrun.core.tokens import PADDING_ID
from accumrun.data.tokenizers.base import Tokenizer, TokenizerSection

if TYPE_CHECKING:
    import tensorflow as tf


class CharacterTokenizerConfig(TokenizerSection):
    """``tokenizer: {name: character}``: code point ``c`` is id ``c + 2`` below ``vocabulary_size``, else 1 (unknown);
    0 pads. The default 258 ids cover Latin-1; 65,538 would cover the Basic Multilingual Plane."""

    name: Literal["character"]
    vocabulary_size: int = Field(258, ge=3)
    """Ids in all, padding's 0 and unknown's 1 among them."""


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


def build_character(config: CharacterTokenizerConfig) -> Tokenizer:
    """The character tokenizer of ``config.vocabulary_size`` ids."""
    return CharacterTokenizer(config.vocabulary_size)
