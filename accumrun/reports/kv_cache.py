"""Cached decoding for the built-in transformer (:mod:`accumrun.models.transformer`): each new token costs one
position's work, not the whole window's.

The decoding runs the loaded model's own layers through the model's cache-aware call
(:meth:`accumrun.models.transformer.Transformer.call_with_cache`), as KerasHub's ``call_with_cache`` does: each
attention layer's keys and values of the positions already fed are kept in buffers of ``sequence_length``
positions, and a step feeds one token at its position. A compiled loop runs such steps, picking each next token,
several per call.

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

from accumrun.models.transformer import KeyValueCache, Transformer
from accumrun.reports.picking import pick


class CachedDecoding(ABC):
    """Feeds a window's tokens one position at a time over the keys and values of the positions before them, and
    picks the tokens after them, several per compiled call (one call per token would cost more in TensorFlow's
    dispatch than the position's work). One compiled loop per temperature: a greedy one draws no noise."""

    def __init__(self, length: int) -> None:
        self.length = length
        self._loops: dict[float, Callable[..., tf.Tensor]] = {}
        self._carry: tf.Variable | None = None
        """A cache that the loop carries from position to position as a tensor, kept here between calls; None for
        one in variables that a step writes in place."""

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

    def _extended(
        self, ids: tf.Tensor, fed: tf.Tensor, known: tf.Tensor, count: tf.Tensor, seed: tf.Tensor, *, temperature: float
    ) -> tf.Tensor:
        """The compiled loop of :meth:`extend`."""

        def feed(position: tf.Tensor, ids: tf.Tensor, carried: Any) -> tuple[tf.Tensor, tf.Tensor, Any]:
            logits, carried = self._logits_at(ids[position], position, carried)
            chosen = pick(logits, temperature, seed, position + 1)
            # A position before the last known one is followed by a known token; only the later ones pick.
            following = tf.where(position + 1 >= known, chosen, ids[position + 1])
            return position + 1, tf.tensor_scatter_nd_update(ids, [[position + 1]], [following]), carried

        # One iteration at a time: each needs the token the one before picked, and TensorFlow's default of 10
        # in flight only adds scheduling (twice the time per token on 2 CPU cores).
        _, ids, carried = tf.while_loop(
            lambda position, ids, carried: position < known + count - 1,
            feed,
            [fed, ids, () if self._carry is None else self._carry.read_value()],
            parallel_iterations=1,
        )
        if self._carry is not None:
            self._carry.assign(carried)
        return ids

    @abstractmethod
    def _logits_at(self, token: tf.Tensor, position: tf.Tensor, carried: Any) -> tuple[tf.Tensor, Any]:
        """The logits at ``position`` for ``token`` there, and what the loop carries on."""


class CachedTransformer(CachedDecoding):
    """The built-in transformer's cached decoding: its own forward pass, one position at a time over its keys and
    values (:meth:`accumrun.models.transformer.Transformer.call_with_cache`)."""

    def __init__(self, transformer: Transformer) -> None:
        super().__init__(transformer.length)
        self._transformer = transformer
        self._cache = KeyValueCache(transformer)

    def _logits_at(self, token: tf.Tensor, position: tf.Tensor, carried: Any) -> tuple[tf.Tensor, Any]:
        return self._transformer.call_with_cache(token, position, self._cache), carried


def cached_transformer(model: keras.Model) -> CachedTransformer | None:
    """A cached step for ``model`` when it is the built-in transformer's language model, else None: such a model
    generates uncached."""
    transformer = Transformer.of(model)
    return None if transformer is None else CachedTransformer(transformer)
