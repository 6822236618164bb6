"""Cached decoding for the built-in transformer (:mod:`accumrun.models.transformer`): each new token costs one
position's work, not the whole window's.

The decoding is built from the loaded model's own layers, found by name, so ``model.keras`` stays plain Keras.
Each attention layer's keys and values of the positions already fed are kept in buffers of ``sequence_length``
positions; a step feeds one token at its position, projects its query, key and value with the attention layer's
own projections, writes the key and value into the buffers and attends over the positions fed so far. That is what
the whole model computes for that position: causal attention sees only the real tokens before it, and the window's
padding comes after them. A compiled loop runs such steps, picking each next token, several per call.

The positions are learned and absolute, so the cache holds only within the window: once the text is longer than
``sequence_length``, the window slides, every token moves to another position, and every key and value changes.
The caller then runs the whole model on the sliding window (:func:`accumrun.reports.generate.next_tokens`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from accumrun.reports.picking import pick

_BLOCK_LAYERS = ("attention_norm", "attention", "feed_forward_norm", "feed_forward", "feed_forward_out")


class CachedDecoding(ABC):
    """Feeds a window's tokens one position at a time over the keys and values of the positions before them, and
    picks the tokens after them, several per compiled call (one call per token would cost more in TensorFlow's
    dispatch than the position's work). One compiled loop per temperature: a greedy one draws no noise."""

    def __init__(self, length: int) -> None:
        self.length = length
        self._loops: dict[float, Callable[..., tf.Tensor]] = {}

    def extend(self, ids: np.ndarray, fed: int, known: int, count: int, temperature: float, seed: int) -> np.ndarray:
        """``ids`` (a window of ``length``) with ``count`` more tokens picked after its first ``known``: positions
        ``fed`` to the last but one are fed (those before ``fed`` are in the cache from earlier calls; ``fed`` 0
        starts a new text), and each new token is picked from the logits of the position before it (see
        :func:`accumrun.reports.picking.pick`; its index in the text is its position)."""
        if not 0 <= fed < known or known + count > self.length:
            raise ValueError(f"cannot feed {fed}..{known + count - 2} of a window of {self.length}")
        if temperature not in self._loops:
            scalar = tf.TensorSpec([], tf.int32)
            signature = [tf.TensorSpec([self.length], tf.int32), scalar, scalar, scalar, tf.TensorSpec([], tf.int64)]
            loop = functools.partial(self._extended, temperature=temperature)
            self._loops[temperature] = tf.function(loop, input_signature=signature)
        return np.asarray(self._loops[temperature](tf.constant(ids, tf.int32), fed, known, count, seed))

    @abstractmethod
    def _extended(
        self, ids: tf.Tensor, fed: tf.Tensor, known: tf.Tensor, count: tf.Tensor, seed: tf.Tensor, *, temperature: float
    ) -> tf.Tensor:
        """The compiled loop of :meth:`extend`."""


class CachedTransformer(CachedDecoding):
    """The built-in transformer's cached decoding, from its own layers."""

    def __init__(self, model: keras.Model, blocks: int) -> None:
        super().__init__(int(model.get_layer("position_embedding").input_dim))
        self._token_embedding = model.get_layer("token_embedding")
        self._position_embedding = model.get_layer("position_embedding")
        self._blocks = [{kind: model.get_layer(f"{kind}_{index}") for kind in _BLOCK_LAYERS} for index in range(blocks)]
        self._final_norm = model.get_layer("final_norm")
        self._head = model.get_layer("head")
        attention = self._blocks[0]["attention"]
        shape = (self.length, attention.num_heads, attention.key_dim)
        # Variables, not tensors passed in and out: a step writes one position in place.
        self._keys = [tf.Variable(tf.zeros(shape, attention.compute_dtype), trainable=False) for _ in self._blocks]
        self._values = [tf.Variable(tf.zeros(shape, attention.compute_dtype), trainable=False) for _ in self._blocks]

    def _extended(
        self, ids: tf.Tensor, fed: tf.Tensor, known: tf.Tensor, count: tf.Tensor, seed: tf.Tensor, *, temperature: float
    ) -> tf.Tensor:
        def feed(position: tf.Tensor, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            logits = self._logits_at(ids[position], position)
            chosen = pick(logits, temperature, seed, position + 1)
            # A position before the last known one is followed by a known token; only the later ones pick.
            following = tf.where(position + 1 >= known, chosen, ids[position + 1])
            return position + 1, tf.tensor_scatter_nd_update(ids, [[position + 1]], [following])

        # One iteration at a time: each needs the token the one before picked, and TensorFlow's default of 10
        # in flight only adds scheduling (twice the time per token on 2 CPU cores).
        _, ids = tf.while_loop(
            lambda position, ids: position < known + count - 1, feed, [fed, ids], parallel_iterations=1
        )
        return ids

    def _logits_at(self, token: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
        x = self._token_embedding(token[None, None]) + self._position_embedding(position[None, None])
        # Positions 0..position hold this text's keys; later ones are from an earlier text or zeros, never seen.
        seen = tf.range(self.length) <= position
        for block, keys, values in zip(self._blocks, self._keys, self._values, strict=True):
            x = x + self._attend(block["attention"], block["attention_norm"](x), keys, values, position, seen)
            x = x + block["feed_forward_out"](block["feed_forward"](block["feed_forward_norm"](x)))
        return self._head(self._final_norm(x))[0, 0]

    @staticmethod
    def _attend(
        attention: Any, h: tf.Tensor, keys: tf.Variable, values: tf.Variable, position: tf.Tensor, seen: tf.Tensor
    ) -> tf.Tensor:
        """The attention layer's output for one position: its own projections (Keras' ``MultiHeadAttention``
        sublayers), this position's key and value written into the buffers, then attention over the positions
        seen."""
        query = attention._query_dense(h)  # (1, 1, heads, key_dim)
        keys.scatter_nd_update([[position]], attention._key_dense(h)[0])
        values.scatter_nd_update([[position]], attention._value_dense(h)[0])
        output = keras.ops.dot_product_attention(
            query,
            keys[None],
            values[None],
            mask=seen[None, None, None, :],
            scale=attention._inverse_sqrt_key_dim,
        )
        return attention._output_dense(output)


def cached_transformer(model: keras.Model) -> CachedTransformer | None:
    """A cached step for ``model`` when it is the built-in transformer's language model (its layers by name, a
    causal model with attention layers of the shape it builds), else None: such a model generates uncached."""
    names = {layer.name for layer in model.layers}
    if model.name != "transformer_lm" or not {"token_embedding", "position_embedding", "final_norm", "head"} <= names:
        return None
    blocks = 0
    while all(f"{kind}_{blocks}" in names for kind in _BLOCK_LAYERS):
        blocks += 1
    attentions = [model.get_layer(f"attention_{index}") for index in range(blocks)]
    if not blocks or not all(isinstance(layer, keras.layers.MultiHeadAttention) for layer in attentions):
        return None
    return CachedTransformer(model, blocks)
