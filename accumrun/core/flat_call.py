"""A layer call as a function of its floating-point tensors alone: :class:`FlatCall`.

``tf.custom_gradient`` and ``tf.recompute_grad`` differentiate a function of positional tensors (keyword arguments
only eagerly), and a layer's call takes keywords, masks and ids too. Remat (:mod:`accumrun.core.recompute`) and the
deferred backward pass (:mod:`accumrun.core.deferred`) both give them the call in this form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf


class FlatCall:
    """``call(*args, **kwargs)`` taking the floating-point tensors among ``args`` and ``kwargs`` (an input passed by
    keyword too) positionally, and returning its outputs as a flat list. Everything else (``training``, masks, ids)
    is bound as given."""

    def __init__(self, call: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self._call = call
        self._arguments = (list(args), kwargs)
        self._flat = tf.nest.flatten(self._arguments)
        self._floating = [
            i for i, value in enumerate(self._flat) if isinstance(value, tf.Tensor) and value.dtype.is_floating
        ]
        self._outputs: list[Any] = []

    @property
    def inputs(self) -> list[tf.Tensor]:
        """The tensors it takes, as given."""
        return [self._flat[i] for i in self._floating]

    @property
    def ran(self) -> bool:
        """Whether it has run at least once (a later run is a recomputation)."""
        return bool(self._outputs)

    def __call__(self, *tensors: tf.Tensor) -> list[tf.Tensor]:
        values = list(self._flat)
        for i, tensor in zip(self._floating, tensors, strict=True):
            values[i] = tensor
        args, kwargs = tf.nest.pack_sequence_as(self._arguments, values)
        outputs = self._call(*args, **kwargs)
        self._outputs[:] = [outputs]
        return tf.nest.flatten(outputs)

    def structured(self, outputs: Sequence[tf.Tensor]) -> Any:
        """Flat ``outputs`` in the structure the call returned (once it has run)."""
        return tf.nest.pack_sequence_as(self._outputs[0], list(outputs))
