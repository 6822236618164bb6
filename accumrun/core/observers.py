"""Observers: what the step measures of each batch beside its update, from what accumulation has in hand.

An observer is a per-sub-batch quantity in four parts, which the step runs the same way for every observer, without
knowing what it measures:

- its **state**, ``state_width`` float32 numbers, zero at a batch's start;
- its **update per sub-batch**, :meth:`Observer.sub_batch`, from the sub-batch's share of the batch's gradient and
  its units (samples, or real tokens), added to the state inside the step's sub-batch loop;
- its **reduction across replicas**: the states are summed over the replicas in the step's one small all-reduce
  (beside the loss sum); then :meth:`Observer.batch` runs on each replica, and may ask for the batch's gradient
  summed over the replicas (one more all-reduce, paid only when an observer asks);
- its **result per update**, :meth:`Observer.result`, ``width`` float64 numbers, from what :meth:`Observer.batch`
  returned and the batch's :class:`BatchScale`.

The step concatenates the results of its observers, in order, into :attr:`~accumrun.core.spec.BatchResult.measures`;
:meth:`Observers.columns` says which columns are whose. An observer never changes the update.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf


class BatchScale(NamedTuple):
    """What turns a batch's accumulated numbers into its own: what each sub-batch's loss sum was divided by, the
    batch's units, and the loss scale that multiplied the gradients (1 without one)."""

    divided_by: tf.Tensor
    units: tf.Tensor
    loss_scale: tf.Tensor


class Observer(ABC):
    """A quantity measured of every batch from its sub-batches (see the module's docstring)."""

    name: str
    """What it is called, to find its columns (:meth:`Observers.columns`)."""
    state_width: int
    """How many float32 numbers each sub-batch adds to the state."""
    width: int
    """How many float64 numbers its result per update has."""
    least_parts: int = 1
    """The fewest parts (sub-batches over every replica) a batch needs for it to measure anything."""

    @abstractmethod
    def sub_batch(self, gradients: list[tf.Tensor | None], units: tf.Tensor) -> tf.Tensor:
        """The sub-batch's addition to the state (``[state_width]``, float32), from its share of the batch's
        gradient (None for a variable its loss does not reach) and its units. It runs for every sub-batch."""

    def batch(self, state: tf.Tensor, gradient: Callable[[], list[tf.Tensor]]) -> Any:
        """On each replica, after the reduction: what the result needs of the batch, from ``state`` (summed over the
        sub-batches and replicas) and, if it calls it, ``gradient()``, the batch's accumulated gradient summed over
        the replicas. It must be the same on every replica; the state itself by default."""
        return state

    @abstractmethod
    def result(self, batch: Any, scale: BatchScale) -> tf.Tensor:
        """The batch's result (``[width]``, float64), from what :meth:`batch` returned."""


class Observers:
    """The observers a step runs, in order, as one: one state vector, one result vector."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self._observers = tuple(observers)
        self.state_width = sum(o.state_width for o in self._observers)
        """The width of the state of them all."""
        self.width = sum(o.width for o in self._observers)
        """The width of :attr:`~accumrun.core.spec.BatchResult.measures`."""

    def __bool__(self) -> bool:
        return bool(self._observers)

    def columns(self, name: str) -> slice | None:
        """The columns of the observer ``name`` in a batch's measures, or None when the step does not run it."""
        start = 0
        for observer in self._observers:
            if observer.name == name:
                return slice(start, start + observer.width)
            start += observer.width
        return None

    def zeros(self) -> tf.Tensor:
        """The state at a batch's start."""
        return tf.constant(0.0, tf.float32, shape=[self.state_width])

    def sub_batch(self, gradients: list[tf.Tensor | None], units: Callable[[], tf.Tensor]) -> tf.Tensor:
        """Every observer's addition to the state for one sub-batch of ``units()`` units (counted only where an
        observer runs: this is the loop's hot path)."""
        if not self._observers:
            return self.zeros()
        count = units()
        return _joined([o.sub_batch(gradients, count) for o in self._observers])

    def batch(self, state: tf.Tensor, gradients: list[tf.Tensor], context: tf.distribute.ReplicaContext | None) -> Any:
        """On each replica, every observer's :meth:`Observer.batch`, from the state summed over the replicas and the
        replica's own ``gradients``; they are summed over the replicas once, for the first observer that asks."""
        summed: list[list[tf.Tensor]] = []

        def gradient() -> list[tf.Tensor]:
            if not summed:
                # The replicas' gradients summed, as the update will sum them: one more all-reduce, that only an
                # observer that asks for it makes a replicated step pay.
                summed.append(
                    gradients if context is None else context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
                )
            return summed[0]

        if len(self._observers) == 1:
            return (self._observers[0].batch(state, gradient),)
        values = []
        start = 0
        for observer in self._observers:
            values.append(observer.batch(state[start : start + observer.state_width], gradient))
            start += observer.state_width
        return tuple(values)

    def results(self, batch: Any, scale: BatchScale) -> tf.Tensor:
        """The batch's measures, from what :meth:`batch` returned (an empty vector without observers)."""
        if not self._observers:
            return tf.zeros([0], tf.float64)
        return _joined([o.result(value, scale) for o, value in zip(self._observers, batch, strict=True)])


def _joined(parts: list[tf.Tensor]) -> tf.Tensor:
    """``parts`` as one vector; one part as it is, without a copy."""
    return parts[0] if len(parts) == 1 else tf.concat(parts, 0)
