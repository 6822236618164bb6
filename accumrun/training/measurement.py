"""What a measurement of ``training.measure`` is to the trainer: a hook that adds its figures to an epoch's row,
perhaps an observer inside the step, and its part of the console line. Each measurement is one module that
declares a :class:`Measurement`, registered by name in :mod:`accumrun.training.measurements`; what it reads and
refuses of the config is declared in :mod:`accumrun.config.measures`."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import keras
import tensorflow as tf

from accumrun.config.schema import TrainingConfig
from accumrun.core.hessian import Chunks, HessianVectorProducts
from accumrun.core.losses import Objective
from accumrun.core.observers import Observer, Observers
from accumrun.training.cadence import Cadence
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import Hook


@dataclass(frozen=True, kw_only=True)
class Measuring:
    """What a measurement's hook is built from."""

    training: TrainingConfig
    seed: int
    batch_size: int | None
    """Samples per batch; None for a token-level objective, whose batches count tokens."""
    optimizer: keras.optimizers.Optimizer
    observers: Observers
    """What the step measures of each batch (some measurements are not run where a batch has too few parts)."""
    cadence: Cadence
    echo: Callable[[str], None]
    model: keras.Model
    objective: Objective
    chunks: Chunks
    """The ``measure_samples`` training samples, in chunks of the training sub-batch's size (the memory of one
    chunk's double backward pass)."""

    @functools.cached_property
    def products(self) -> HessianVectorProducts:
        """Hessian-vector products of the training objective over :attr:`chunks`, one for every measurement that
        asks."""
        return HessianVectorProducts(self.model, self.objective, self.chunks)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One measurement, as its module declares it."""

    hook: Callable[[Measuring], Hook]
    """Its hook, which adds its figures to the rows of the epochs it measured (each a curve in TensorBoard)."""
    observer: Callable[[TrainingConfig, tf.Variable], Observer] | None = None
    """What it measures inside the step, of every batch's sub-batches (:mod:`accumrun.core.observers`), from the
    ``training`` section and the update counter (the optimizer's step counter)."""
    note: Callable[[TrainingConfig, bool], str | None] | None = None
    """What ``check`` says of it, given whether the step runs its observer (None: nothing to say)."""
    periodic: bool = False
    """It is measured between updates after every ``measure_every``-th epoch, whose end then ends a call."""
    line: Callable[[Mapping[str, float]], str | None] | None = None
    """Its part of the epoch's console line, from the row's figures (None where the row has none of its own)."""


class Periodic(Hook, ABC):
    """A measurement made on the host between updates, in the row of every ``measure_every``-th epoch (the cadence
    ends a call there, so the weights are the epoch's)."""

    measures = True

    def __init__(self, measuring: Measuring) -> None:
        self._measuring = measuring

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        if not (ends_call and self._measuring.cadence.measures_after(position.epoch)):
            return {}
        return self.measure(position)

    @abstractmethod
    def measure(self, position: Position) -> dict[str, float]:
        """The figures of the epoch that ``position`` has just finished."""
