"""A KerasHub tokenizer as accumrun's :class:`Tokenizer`: what ``word_piece`` and ``preset`` build."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accumrun.core.tokens import PADDING_ID
from accumrun.data.tokenizers.base import Tokenizer
from accumrun.errors import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf

_CHUNK = 1024
"""Texts tokenized in one call on the host (:meth:`KerasHubTokenizer.encode`)."""


class KerasHubTokenizer(Tokenizer):
    """A KerasHub tokenizer (WordPiece, or a preset's), TensorFlow ops already (tensorflow-text), run traced on the
    host as in the graph, so the two encode alike. Its id 0 must pad: else a ConfigError under ``key`` names
    ``source`` (or the token)."""

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
        self._encoders: dict[int | None, Callable[[tf.Tensor], Any]] = {}

    def ids(self, text: str) -> np.ndarray:
        import tensorflow as tf

        return np.asarray(self._traced(None)(tf.constant([text])).flat_values, np.int32)

    def encode(self, texts: Iterable[str], length: int) -> np.ndarray:
        # In one call per chunk of texts: a traced call costs more than the eager tokenizer on one text, and far less
        # on many (3,000 short texts here: 0.57 s, against 1.36 s eagerly one at a time).
        import tensorflow as tf

        texts = list(texts)
        chunks = [
            self.encode_tensor(tf.constant(texts[start : start + _CHUNK], tf.string), length).numpy()
            for start in range(0, len(texts), _CHUNK)
        ]
        return np.concatenate(chunks) if chunks else np.zeros((0, length), np.int32)

    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        return self._traced(length)(texts)

    def _traced(self, length: int | None) -> Callable[[tf.Tensor], Any]:
        """The tokenizer's ops on texts ``[n]``, cut and padded to ``length`` (None: each text's ids, uncut, ragged),
        traced once and called by every reader, host and graph alike: a KerasHub tokenizer called eagerly cuts some
        texts into other tokens than in a graph (``"line\\x00nul"``: two against one), and ``tf.data`` traces a map's
        function again for each pipeline it builds (each split, each epoch), where these ops take about half a second
        to trace."""
        if length not in self._encoders:
            import tensorflow as tf

            self._encoders[length] = tf.function(functools.partial(self._encoded, length=length))
        return self._encoders[length]

    def _encoded(self, texts: tf.Tensor, length: int | None) -> Any:
        import tensorflow as tf

        ids = tf.cast(self._tokenizer(texts), tf.int32)
        return ids if length is None else ids[:, :length].to_tensor(default_value=PADDING_ID, shape=[None, length])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        text = self._tokenizer.detokenize(self._checked(ids).astype(np.int32))
        return str(np.asarray(text).item().decode("utf-8") if hasattr(text, "numpy") else text)
