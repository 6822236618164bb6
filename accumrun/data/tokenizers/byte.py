"""``data.tokenizer: {name: byte}``: each UTF-8 byte is a token, no vocabulary to learn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from accumrun.core.tokens import PADDING_ID
from accumrun.data.tokenizers.base import Tokenizer, TokenizerSection

if TYPE_CHECKING:
    import tensorflow as tf


class ByteTokenizerConfig(TokenizerSection):
    """``tokenizer: {name: byte}``: each UTF-8 byte is a token (ids 1 to 256; 0 pads), no vocabulary to learn."""

    name: Literal["byte"]


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


def build_byte(config: ByteTokenizerConfig) -> Tokenizer:
    """The byte tokenizer (it has no settings)."""
    return ByteTokenizer()
