"""The built-in ``transformer`` over token ids: an encoder for text classification, or with causal masking a
decoder for a language model.

Token id 0 is padding: nothing attends to it, and for a classifier the pooled vector is the mean over the real
tokens, so a sample's logits do not depend on how much padding it has, nor on the other samples of its
(sub-)batch. A language model's position ``i`` attends to the real tokens ``0..i`` alone and gives the logits of
the token after it. Positions are learned. Only Keras layers and ops, so ``model.keras`` loads without accumrun.

The forward pass is written once (:class:`Transformer`). Over whole windows it makes the Keras model; a language
model also runs one position at a time over the keys and values of the positions before it
(:meth:`Transformer.call_with_cache`), which cached generation drives (:mod:`accumrun.reports.kv_cache`). The layers
of a model, built here or loaded from its ``model.keras``, are found again by their kinds (:meth:`Transformer.of`).
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from accumrun.errors import ConfigError
from accumrun.models.dtypes import logits_dtype

Attend = Callable[[int, keras.layers.MultiHeadAttention, Any], Any]
"""How a block runs its attention layer on its normed input: given the block's index, the layer and that input, the
layer's output (over the whole window, or for one position over the cache)."""

_LANGUAGE_MODEL = "transformer_lm"
"""The name of the causal model, recorded in ``model.keras``: what says a loaded model is the language model."""


@dataclass(frozen=True)
class Block:
    """One pre-norm block: self-attention, then a feed-forward layer of 4x the width, each added to the residual
    stream after its dropout. Its layers in the order the data meets them; each feeds the next, so that is also
    their order in a Keras model of them."""

    attention_norm: keras.layers.LayerNormalization
    attention: keras.layers.MultiHeadAttention
    attention_dropout: keras.layers.Dropout
    feed_forward_norm: keras.layers.LayerNormalization
    feed_forward: keras.layers.Dense
    feed_forward_out: keras.layers.Dense
    feed_forward_dropout: keras.layers.Dropout

    @classmethod
    def new(
        cls, index: int, *, heads: int, width: int, dropout: float, attention_bias: bool, length: int | None
    ) -> Block:
        """The layers of block ``index``, for sequences of ``length`` (None: any) of ``width``."""
        attention_norm = keras.layers.LayerNormalization(name=f"attention_norm_{index}")
        attention = keras.layers.MultiHeadAttention(
            heads, width // heads, dropout=dropout, use_bias=attention_bias, name=f"attention_{index}"
        )
        # Each layer draws its initial weights' seed when it is made, and the attention its projections' when it is
        # built: built here, before the next layer is made, the draws come in the order of a model whose layers are
        # each made just before their first call (the weights of a seed are those of runs before this class).
        attention.build((None, length, width), (None, length, width))
        return cls(
            attention_norm,
            attention,
            keras.layers.Dropout(dropout),
            keras.layers.LayerNormalization(name=f"feed_forward_norm_{index}"),
            keras.layers.Dense(4 * width, activation="gelu", name=f"feed_forward_{index}"),
            keras.layers.Dense(width, name=f"feed_forward_out_{index}"),
            keras.layers.Dropout(dropout),
        )

    def __call__(self, x: Any, attend: Callable[[keras.layers.MultiHeadAttention, Any], Any]) -> Any:
        h = attend(self.attention, self.attention_norm(x))
        x = x + self.attention_dropout(h)
        h = self.feed_forward_out(self.feed_forward(self.feed_forward_norm(x)))
        return x + self.feed_forward_dropout(h)


_BLOCK_KINDS = tuple(typing.get_type_hints(Block).values())
"""The kinds of a block's layers, in its order."""


@dataclass(frozen=True)
class Transformer:
    """The transformer's layers and its forward pass: embeddings of the tokens and their positions, the blocks, a
    final norm, and the head of logits."""

    token_embedding: keras.layers.Embedding
    position_embedding: keras.layers.Embedding
    blocks: list[Block]
    final_norm: keras.layers.LayerNormalization
    head: keras.layers.Dense

    @classmethod
    def new(
        cls,
        vocabulary_size: int,
        length: int,
        outputs: int,
        *,
        layers: int,
        heads: int,
        width: int,
        dropout: float,
        attention_bias: bool,
        any_length: bool,
    ) -> Transformer:
        """New layers (see :func:`transformer`), made in the order the data meets them."""
        token_embedding = keras.layers.Embedding(vocabulary_size, width, name="token_embedding")
        position_embedding = keras.layers.Embedding(length, width, name="position_embedding")
        size = None if any_length else length
        blocks = [
            Block.new(index, heads=heads, width=width, dropout=dropout, attention_bias=attention_bias, length=size)
            for index in range(layers)
        ]
        final_norm = keras.layers.LayerNormalization(name="final_norm")
        return cls(
            token_embedding,
            position_embedding,
            blocks,
            final_norm,
            keras.layers.Dense(outputs, dtype=logits_dtype(), name="head"),
        )

    @classmethod
    def of(cls, model: keras.Model) -> Transformer | None:
        """The layers of ``model`` when it is the built-in transformer's language model, made here or loaded from its
        ``model.keras`` (by Keras alone, so as plain Keras layers), else None. They are found by their kinds in the
        order the data meets them, which is Keras' order; the one pair in parallel, the two embeddings, by their
        inputs: the token embedding reads the model's input."""
        layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
        count, rest = divmod(len(layers) - 4, len(_BLOCK_KINDS))
        if model.name != _LANGUAGE_MODEL or count < 1 or rest:
            return None
        kinds = (
            [keras.layers.Embedding] * 2
            + [*_BLOCK_KINDS] * count
            + [keras.layers.LayerNormalization, keras.layers.Dense]
        )
        if not all(isinstance(layer, kind) for layer, kind in zip(layers, kinds, strict=True)):
            return None
        token_embedding, position_embedding = sorted(layers[:2], key=lambda layer: layer.input is not model.input)
        starts = range(2, len(layers) - 2, len(_BLOCK_KINDS))
        blocks = [Block(*layers[start : start + len(_BLOCK_KINDS)]) for start in starts]
        return cls(token_embedding, position_embedding, blocks, layers[-2], layers[-1])

    @property
    def length(self) -> int:
        """The window: how many positions have an embedding."""
        return int(self.position_embedding.input_dim)

    def hidden(self, ids: Any, positions: Any, attend: Attend) -> Any:
        """The final norm's output for ``ids`` at ``positions``: what the head turns into logits."""
        x = self.token_embedding(ids) + self.position_embedding(positions)
        for index, block in enumerate(self.blocks):
            x = block(x, functools.partial(attend, index))
        return self.final_norm(x)

    def call_with_cache(self, token: tf.Tensor, position: tf.Tensor, cache: KeyValueCache) -> tf.Tensor:
        """The language model's logits at ``position`` for ``token`` there, over ``cache``, which holds the keys and
        values of the positions before it and takes this position's: what the whole model computes at that
        position, since causal attention sees only the real tokens before it and padding comes after them."""
        # Positions 0..position hold this text's keys; later ones are from an earlier text or zeros, never seen.
        seen = tf.range(cache.length) <= position
        attend = functools.partial(cache.attend, position=position, seen=seen)
        return self.head(self.hidden(token[None, None], position[None, None], attend))[0, 0]


class KeyValueCache:
    """Each block's keys and values of the positions fed so far, in buffers of the window's positions. Variables,
    not tensors passed in and out: a step writes one position in place."""

    def __init__(self, transformer: Transformer) -> None:
        self.length = transformer.length
        self._keys = [self._buffer(block.attention) for block in transformer.blocks]
        self._values = [self._buffer(block.attention) for block in transformer.blocks]

    def _buffer(self, attention: keras.layers.MultiHeadAttention) -> tf.Variable:
        shape = (self.length, attention.num_heads, attention.key_dim)
        return tf.Variable(tf.zeros(shape, attention.compute_dtype), trainable=False)

    def attend(
        self,
        index: int,
        attention: keras.layers.MultiHeadAttention,
        h: tf.Tensor,
        *,
        position: tf.Tensor,
        seen: tf.Tensor,
    ) -> tf.Tensor:
        """Block ``index``'s attention output for one position: the layer's own projections, this position's key and
        value written into the buffers, then attention over the positions ``seen``, scaled as the layer scales it."""
        keys, values = self._keys[index], self._values[index]
        query = attention.query_dense(h)  # (1, 1, heads, key_dim)
        keys.scatter_nd_update([[position]], attention.key_dense(h)[0])
        values.scatter_nd_update([[position]], attention.value_dense(h)[0])
        output = keras.ops.dot_product_attention(
            query, keys[None], values[None], mask=seen[None, None, None, :], scale=1.0 / math.sqrt(attention.key_dim)
        )
        return attention.output_dense(output)


def transformer(
    sample_shape: tuple[int, ...],
    outputs: int,
    vocabulary_size: int | None,
    *,
    layers: int,
    heads: int,
    width: int,
    dropout: float,
    causal: bool = False,
    any_length: bool = False,
    attention_bias: bool = False,
) -> keras.Model:
    """``layers`` pre-norm blocks (self-attention of ``heads`` heads, then a feed-forward layer of 4x ``width``),
    each followed by ``dropout``, over token ids of ``sample_shape`` = ``(sequence_length,)``: logits of ``outputs``
    from the mean of the real tokens, or with ``causal`` logits of ``outputs`` (the vocabulary) at every position,
    each position seeing only itself and the real tokens before it. With ``any_length`` the model takes sequences
    of any length up to ``sequence_length`` (bucketed padding cuts sub-batches shorter). ``attention_bias`` gives
    the attention's query, key, value and output projections biases (Keras has one switch for all four); the key's
    bias adds the same number to every score of a query, which the softmax ignores, so its true gradient is 0.

    Raises:
        ConfigError: the samples are not token ids (``vocabulary_size`` is None: not a text source).
    """
    if vocabulary_size is None or len(sample_shape) != 1:
        raise ConfigError(
            "model.name", "transformer reads token ids: use a text source (data.name: text_folder or text_corpus)"
        )
    (length,) = sample_shape
    ids = keras.Input(shape=(None if any_length else length,), dtype="int32", name="token_ids")
    real = keras.ops.not_equal(ids, 0)
    # Query i may attend to key j when both are real tokens (and, causal, j <= i: the attention layer adds that).
    attention_mask = keras.ops.logical_and(real[:, :, None], real[:, None, :])
    positions = keras.ops.cumsum(keras.ops.ones_like(ids), axis=1) - 1
    model = Transformer.new(
        vocabulary_size,
        length,
        outputs,
        layers=layers,
        heads=heads,
        width=width,
        dropout=dropout,
        attention_bias=attention_bias,
        any_length=any_length,
    )

    def attend(index: int, attention: keras.layers.MultiHeadAttention, h: Any) -> Any:
        return attention(h, h, attention_mask=attention_mask, use_causal_mask=causal)

    x = model.hidden(ids, positions, attend)
    if causal:
        return keras.Model(ids, model.head(x), name=_LANGUAGE_MODEL)
    weights = keras.ops.cast(real, x.dtype)[:, :, None]
    pooled = keras.ops.sum(x * weights, axis=1) / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)
    return keras.Model(ids, model.head(pooled), name="transformer")
