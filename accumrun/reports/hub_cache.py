"""Cached decoding for a KerasHub backbone's language model (:mod:`accumrun.models.hub`), with KerasHub's own cache.

KerasHub gives most causal backbones a ``CausalLM`` task whose ``call_with_cache(token_ids, cache, index)`` runs
the tokens at ``index`` over the cached keys and values of the positions before it and returns its hidden states
(the backbone's output) with the cache updated. The task is built around the loaded backbone (the same layers and
weights), and accumrun's head turns the hidden state into the next token's logits, as the whole model does.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import keras
import tensorflow as tf

from accumrun.reports.kv_cache import CachedDecoding


class CachedHubModel(CachedDecoding):
    """Cached decoding over a KerasHub ``CausalLM``'s ``call_with_cache``."""

    def __init__(self, task: Any, head: keras.layers.Layer, length: int) -> None:
        super().__init__(length)
        self._task = task
        self._head = head
        # The cache's shape and dtype are the task's own; positions not fed yet are never attended.
        empty = task._build_cache(tf.zeros((1, length), tf.int32))[1]
        self._carry = tf.Variable(tf.zeros_like(empty), trainable=False)

    def _logits_at(self, token: tf.Tensor, position: tf.Tensor, carried: Any) -> tuple[tf.Tensor, Any]:
        _, hidden, cache = self._task.call_with_cache(token[None, None], carried, position)
        return self._head(hidden)[0, 0], cache


def cached_hub_model(model: keras.Model, length: int) -> CachedHubModel | None:
    """A cached step for ``model`` when it is a KerasHub backbone with accumrun's language-model head and KerasHub
    pairs the backbone with a ``CausalLM`` task that has ``call_with_cache``, else None."""
    keras_hub = sys.modules.get("keras_hub")  # loading a model with a KerasHub backbone imported it
    if keras_hub is None or "head" not in {layer.name for layer in model.layers}:
        return None
    backbones = [layer for layer in model.layers if isinstance(layer, keras_hub.models.Backbone)]
    if len(backbones) != 1:
        return None
    (backbone,) = backbones
    task_class = _causal_task(keras_hub, type(backbone))
    if task_class is None:
        return None
    try:
        return CachedHubModel(task_class(backbone=backbone), model.get_layer("head"), length)
    except (TypeError, ValueError):
        # A task that needs more than the backbone (Gemma3's preprocessor, a vision model's images) to build or to
        # start its cache: such a model generates uncached, as any other.
        return None


def _causal_task(keras_hub: Any, backbone_class: type) -> Any:
    """The ``CausalLM`` task class that KerasHub pairs with ``backbone_class``, if it decodes with a cache."""
    for value in vars(keras_hub.models).values():
        if (
            inspect.isclass(value)
            and issubclass(value, keras_hub.models.CausalLM)
            and getattr(value, "backbone_cls", None) is backbone_class
            and hasattr(value, "call_with_cache")
        ):
            return value
    return None
