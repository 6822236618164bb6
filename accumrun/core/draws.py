"""Random numbers per sample: a counter-based generator, and Keras' stochastic layers drawing from it.

A draw for one element of one sample is a hash of ``(key, row, element)``: the key stands for the seed, the layer
and the update, the row is the sample's place in the global batch, and the element is its index inside the
sample's noise. Nothing else enters it, so the same sample in the same update gets the same mask however the batch
is cut, streamed or dealt out to replicas, and the draw is vectorized over a sub-batch without ever making the
whole batch's mask. The hash is MurmurHash3's 32-bit finalizer applied twice, in uint32 arithmetic that every
TensorFlow device runs.

:data:`PER_SAMPLE_LAYERS` reproduces, in training mode, what each of Keras' stochastic layers computes, with its
draws taken from here (their inference mode, and any other call, stays Keras' own).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import keras
import tensorflow as tf

_MIX_1, _MIX_2, _GOLDEN = 0x85EBCA6B, 0xC2B2AE35, 0x9E3779B9
# SELU's constants, as AlphaDropout uses them.
_ALPHA_P = -1.6732632423543772848170429916717 * 1.0507009873554804934193349852946


def _mix(h: tf.Tensor) -> tf.Tensor:
    """MurmurHash3's finalizer: each input bit flips each output bit with probability about 1/2."""
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))
    h = h * tf.constant(_MIX_1, tf.uint32)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(13, tf.uint32)))
    h = h * tf.constant(_MIX_2, tf.uint32)
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))


def _low_bits(value: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.bitwise.bitwise_and(tf.cast(value, tf.int64), tf.constant(0xFFFFFFFF, tf.int64)), tf.uint32)


def row_bits(key: tf.Tensor, rows: tf.Tensor, sample_shape: tf.Tensor) -> tf.Tensor:
    """32 random bits per element: shape ``[len(rows), *sample_shape]``, a function of ``key`` (two integers),
    each row's number in ``rows`` and the element's index alone."""
    k0, k1 = _low_bits(key[0]), _low_bits(key[1])
    row_keys = _mix(tf.bitwise.bitwise_xor(_mix(_low_bits(rows) + k1), k0))
    elements = tf.range(tf.reduce_prod(sample_shape), dtype=tf.int32)
    element_keys = _mix(tf.cast(elements, tf.uint32) * tf.constant(_GOLDEN, tf.uint32) + k0)
    bits = _mix(_mix(tf.bitwise.bitwise_xor(row_keys[:, tf.newaxis], element_keys[tf.newaxis, :])) + k1)
    return tf.reshape(bits, tf.concat([tf.shape(rows), sample_shape], axis=0))


def to_uniform(bits: tf.Tensor) -> tf.Tensor:
    """Random bits as uniform float32 in ``[0, 1)``, 24 bits each."""
    return tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32) * (1.0 / (1 << 24))


def to_normal(bits: tf.Tensor) -> tf.Tensor:
    """Random bits as standard normal float32: the inverse normal CDF of a uniform in ``(0, 1)``."""
    return tf.math.ndtri(to_uniform(bits) + 0.5 / (1 << 24))


Draw = Callable[[tf.Tensor], tf.Tensor]
"""``draw(sample_shape) -> bits [rows, *sample_shape]``: one layer call's per-sample random bits."""


def _noise_shape(layer: keras.layers.Layer, inputs: tf.Tensor) -> tf.Tensor:
    """The layer's noise shape past the batch axis, its unknown sizes taken from ``inputs``."""
    get = getattr(layer, "_get_noise_shape", None)  # the spatial dropouts: one draw per channel
    noise_shape = get(inputs) if get is not None else layer.noise_shape
    if noise_shape is None:
        return tf.shape(inputs)[1:]
    sizes = tf.shape(inputs)
    return tf.stack([sizes[i] if size is None else size for i, size in enumerate(noise_shape)][1:])


def _dropout(layer: keras.layers.Layer, inputs: tf.Tensor, draw: Draw) -> tf.Tensor:
    if layer.rate >= 1.0:
        return tf.zeros_like(inputs)
    kept = to_uniform(draw(_noise_shape(layer, inputs))) >= layer.rate
    # A choice, not a product with a 0/1 mask, as Keras' own dropout: the backward pass then keeps a byte per element
    # (the mask) rather than the mask in the inputs' dtype. The values are the same (a dropped one is +0).
    scaled = inputs * tf.cast(1.0 / (1.0 - layer.rate), inputs.dtype)
    return tf.where(kept, scaled, tf.zeros((), inputs.dtype))


def _gaussian_noise(layer: keras.layers.Layer, inputs: tf.Tensor, draw: Draw) -> tf.Tensor:
    return inputs + tf.cast(layer.stddev * to_normal(draw(tf.shape(inputs)[1:])), inputs.dtype)


def _gaussian_dropout(layer: keras.layers.Layer, inputs: tf.Tensor, draw: Draw) -> tf.Tensor:
    stddev = math.sqrt(layer.rate / (1.0 - layer.rate))
    return inputs * tf.cast(1.0 + stddev * to_normal(draw(tf.shape(inputs)[1:])), inputs.dtype)


def _alpha_dropout(layer: keras.layers.Layer, inputs: tf.Tensor, draw: Draw) -> tf.Tensor:
    kept = to_uniform(draw(_noise_shape(layer, inputs))) >= layer.rate
    a = ((1 - layer.rate) * (1 + layer.rate * _ALPHA_P**2)) ** -0.5
    b = -a * _ALPHA_P * layer.rate
    return a * tf.where(kept, inputs, tf.constant(_ALPHA_P, inputs.dtype)) + b  # a 1-byte mask, as _dropout keeps


PerSampleCall = Callable[[keras.layers.Layer, tf.Tensor, Draw], tf.Tensor]

PER_SAMPLE_LAYERS: dict[type, PerSampleCall] = {
    keras.layers.Dropout: _dropout,
    keras.layers.SpatialDropout1D: _dropout,
    keras.layers.SpatialDropout2D: _dropout,
    keras.layers.SpatialDropout3D: _dropout,
    keras.layers.GaussianNoise: _gaussian_noise,
    keras.layers.GaussianDropout: _gaussian_dropout,
    keras.layers.AlphaDropout: _alpha_dropout,
}
"""Keras' stochastic layers (by exact type: a subclass may draw otherwise) and their training-mode call with
per-sample draws. ``MultiHeadAttention`` and other layers that hold a ``Dropout`` are covered through it."""
