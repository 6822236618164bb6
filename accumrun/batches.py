"""Batches for the device: a tf.data pipeline over arrays kept once in host memory."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


class BatchFeeder:
    """Serves batches of ``(x, y)`` in a given sample order, gathered on the host and prefetched.

    The arrays are copied into host-side tensors once; each epoch only gathers by index. Each batch goes to the
    device whole, in one transfer, when the step is called with it.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        with tf.device("/CPU:0"):
            self._x = tf.constant(x)
            self._y = tf.constant(y)

    def batches(self, order: np.ndarray, batch_size: int, drop_remainder: bool = False) -> tf.data.Dataset:
        """The batches of one pass over the samples in ``order``."""
        indices = tf.data.Dataset.from_tensor_slices(order.astype(np.int64))
        return (
            indices.batch(batch_size, drop_remainder=drop_remainder)
            .map(lambda index: (tf.gather(self._x, index), tf.gather(self._y, index)))
            .prefetch(tf.data.AUTOTUNE)
        )
