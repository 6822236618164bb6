"""The built-in ``transformer`` over token ids: an encoder for text classification, or with causal masking a
decoder for a language model.

Token id 0 is padding: nothing attends to it, and for a classifier the pooled vector is the mean over the real
tokens, so a sample's logits do not depend on how much padding it has, nor on the other samples of its
(sub-)batch. A language model's position ``i`` attends to the real tokens ``0..i`` alone and gives the logits of
the token after it. Positions are learned. Only Keras layers and ops, so ``model.keras`` loads without accumrun.
"""

from __future__ import annotations

import keras

from accumrun.errors import ConfigError


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
    x = keras.layers.Embedding(vocabulary_size, width, name="token_embedding")(ids)
    x = x + keras.layers.Embedding(length, width, name="position_embedding")(positions)
    for index in range(layers):
        h = keras.layers.LayerNormalization(name=f"attention_norm_{index}")(x)
        attention = keras.layers.MultiHeadAttention(
            heads, width // heads, dropout=dropout, use_bias=attention_bias, name=f"attention_{index}"
        )
        h = attention(h, h, attention_mask=attention_mask, use_causal_mask=causal)
        x = x + keras.layers.Dropout(dropout)(h)
        h = keras.layers.LayerNormalization(name=f"feed_forward_norm_{index}")(x)
        h = keras.layers.Dense(4 * width, activation="gelu", name=f"feed_forward_{index}")(h)
        h = keras.layers.Dense(width, name=f"feed_forward_out_{index}")(h)
        x = x + keras.layers.Dropout(dropout)(h)
    x = keras.layers.LayerNormalization(name="final_norm")(x)
    if causal:
        logits = keras.layers.Dense(outputs, dtype="float32", name="head")(x)
        return keras.Model(ids, logits, name="transformer_lm")
    weights = keras.ops.cast(real, x.dtype)[:, :, None]
    pooled = keras.ops.sum(x * weights, axis=1) / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)
    logits = keras.layers.Dense(outputs, dtype="float32", name="head")(pooled)
    return keras.Model(ids, logits, name="transformer")
