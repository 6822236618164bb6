"""What a train step is given and gives back: its options (:class:`StepSpec`, one frozen value), a batch's result
(:class:`BatchResult`), and the interface every step offers the epoch loop (:class:`TrainStep`)."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import tensorflow as tf

from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import MetricSet
from accumrun.core.observers import Observer
from accumrun.core.seeds import LayerDraws
from accumrun.core.targets import Targets
from accumrun.kinds import Feed

Chunk = tuple[tf.Tensor, Targets]
"""``(x, y)``: a whole batch, or one of its sub-batches; ``y`` may carry per-sample weights
(:mod:`accumrun.core.targets`), which every cut slices with the targets."""


class BatchResult(NamedTuple):
    """What a train step returns for one batch."""

    loss_sum: tf.Tensor
    """The sum of the batch's per-sample (or per-token) losses, regularization included."""
    units: tf.Tensor
    """What the loss sum is divided by: the batch's samples, or its real tokens (token-level objectives)."""
    applied: tf.Tensor
    """Whether the update was applied (false: skipped, a NaN or Inf, or a loss-scale overflow)."""
    measures: tf.Tensor
    """The results of the step's observers, concatenated in order (:mod:`accumrun.core.observers`); empty
    without any."""


@dataclass(frozen=True, kw_only=True)
class StepSpec:
    """The options of a train step, one value built once and passed whole (see
    :func:`~accumrun.core.step.make_train_step`). New behaviour arrives as a field here, never as a second factory."""

    subdivisions: int = 1
    """How many sub-batches a whole batch is cut into (a streamed batch arrives already cut)."""
    feed: Feed = Feed.BATCH
    """How batches arrive: whole (one compiled call per batch), or as their sub-batches (one call each)."""
    metrics: MetricSet | None = None
    """The training metrics, updated with every sub-batch's samples (from ``objective.new_metrics()``)."""
    batch_norm: BatchNormStatistics | None = None
    """The BatchNorm mode and statistics (created in the strategy's scope); None is Keras' own, ``sub_batch``."""
    draws: LayerDraws | None = None
    """Per-sample draws of the random layers (dropout), by the update and the sample's row in the batch."""
    bucket: int | None = None
    """Cut each sub-batch of token ids to its longest sequence, rounded up to a multiple of this."""
    jit_compile: bool = False
    """Compile with XLA."""
    observers: tuple[Observer, ...] = ()
    """What the step measures of each batch from its sub-batches (:mod:`accumrun.core.observers`)."""
    inference_mode: bool = False
    """Call the model in inference mode: dropout and noise draw nothing and BatchNorm normalizes with its moving
    statistics, so the objective is a function of the weights alone (L-BFGS's line search needs that)."""
    strategy: tf.distribute.Strategy | None = None
    """Deal each global batch out to the replicas of this strategy (the model, optimizer and metrics created in
    its scope)."""


def step_spec(spec: StepSpec | int, **fields: Any) -> StepSpec:
    """``spec`` (or a spec of ``spec`` subdivisions) with ``fields`` replaced: ``step_spec(3, feed=Feed.SUB_BATCH)``.

    Raises:
        TypeError: a field that :class:`StepSpec` does not have.
    """
    base = spec if isinstance(spec, StepSpec) else StepSpec(subdivisions=spec)
    return dataclasses.replace(base, **fields) if fields else base


class TrainStep(ABC):
    """A compiled train step, as the epoch loop calls it: one batch in, one update."""

    @abstractmethod
    def train_batch(self, chunks: Iterable[Chunk], samples: int) -> BatchResult:
        """Train the batch of ``samples`` samples that ``chunks`` holds (the whole batch as one chunk, or its
        sub-batches in order, as the step takes them) and make its one update."""
