"""A KerasHub tokenizer as accumrun's :class:`Tokenizer`: what ``word_piece`` and ``preset`` build."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accumrun.core.tokens import PADDING_ID
from accumrun.data.tokenizers.base import Tokenizer
from accumrun.errors import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf


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
        self._encoders: dict[int, Callable[[tf.Tensor], tf.Tensor]] = {}

    def ids(self, text: str) -> np.ndarray:
        return np.asarray(self._tokenizer(text), np.int32).reshape(-1)

    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        import tensorflow as tf

        if tf.executing_eagerly():
            return self._encoded(texts, length)
        # In a graph, one trace per length serves every caller: tf.data traces a map's function again for each
        # pipeline it builds (each split, each epoch), and a KerasHub tokenizer's ops take about half a second to
        # trace (its regular expressions, through autograph).
        if length not in self._encoders:
            self._encoders[length] = tf.function(functools.partial(self._encoded, length=length))
        return self._encoders[length](texts)

    def _encoded(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        import tensorflow as tf

        ids = self._tokenizer(texts)
        if not isinstance(ids, tf.RaggedTensor):  # called eagerly, KerasHub returns lists
            ids = tf.ragged.constant(ids, dtype=tf.int32, ragged_rank=1)
        return tf.cast(ids[:, :length], tf.int32).to_tensor(default_value=PADDING_ID, shape=[None, length])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        text = self._tokenizer.detokenize(self._checked(ids).astype(np.int32))
        return str(np.asarray(text).item().decode("utf-8") if hasattr(text, "numpy") else text)
