"""The next token from a language model's logits, as TensorFlow ops, so that the cached decoding picks inside its
compiled loop and the uncached one picks alike."""

from __future__ import annotations

import tensorflow as tf

from accumrun.core.tokens import PADDING_ID


def pick(logits: tf.Tensor, temperature: float, seed: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """The next token (int32) for the ``logits`` of one position: the most likely one for ``temperature`` 0, else a
    draw from ``softmax(logits / temperature)`` that depends on ``seed`` and the token's ``index`` in the text
    alone, so the same call gives the same text however the tokens are computed. Padding is never picked.

    ``temperature`` is a number, fixed where the pick is traced: a greedy pick then draws no noise, which is a
    quarter of a small model's work per token."""
    logits = tf.cast(logits, tf.float32)
    logits = tf.tensor_scatter_nd_update(logits, [[PADDING_ID]], [float("-inf")])
    if temperature == 0:
        return tf.argmax(logits, output_type=tf.int32)
    # Gumbel-max: the argmax of the logits plus Gumbel noise is a draw from their softmax. Philox named, so the
    # compiled (XLA) loop and the plain graph draw the same numbers.
    seeds = tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)])
    uniform = tf.random.stateless_uniform(tf.shape(logits), seeds, minval=1e-20, maxval=1.0, alg="philox")
    return tf.argmax(logits / temperature - tf.math.log(-tf.math.log(uniform)), output_type=tf.int32)
