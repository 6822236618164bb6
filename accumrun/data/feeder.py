"""Batches for the device: one tf.data pipeline over arrays kept once in host memory, reused every epoch."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from accumrun.core.split import epoch_batches


class BatchFeeder:
    """Serves batches of ``(x, y)`` of ``batch_size`` samples in a given sample order, prefetched.

    The arrays are copied into host-side tensors once. The pipeline is built once too: it reads the epoch's
    sample order from a variable, so a new epoch only assigns the order, where building a pipeline would
    retrace its gather function (tens of milliseconds, every epoch). Each batch goes to the device whole, in
    one transfer, when the step is called with it.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, drop_remainder: bool = False) -> None:
        samples = len(x)
        with tf.device("/CPU:0"):
            self._x = tf.constant(x)
            self._y = tf.constant(y)
            self._order = tf.Variable(tf.range(samples, dtype=tf.int64), trainable=False)
        self.count = epoch_batches(samples, batch_size, drop_remainder)[0]
        """The number of batches in a pass."""

        def gather(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            index = self._order[batch * batch_size : tf.minimum((batch + 1) * batch_size, samples)]
            return tf.gather(self._x, index), tf.gather(self._y, index)

        self._from_batch = lambda first: tf.data.Dataset.range(first, self.count).map(gather).prefetch(tf.data.AUTOTUNE)
        self._pipeline = self._from_batch(0)

    def batches(self, order: np.ndarray, skip: int = 0) -> tf.data.Dataset:
        """The batches of one pass over the samples in ``order``, less the first ``skip`` (to resume an epoch).

        Iterate over the result before asking for the next pass: the pipeline reads ``order`` as it goes.
        """
        self._order.assign(order.astype(np.int64))
        return self._pipeline if not skip else self._from_batch(skip)
