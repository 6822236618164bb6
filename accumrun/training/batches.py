"""An epoch's batches through the step, one call at a time, as :class:`~accumrun.core.updates.Updates` either way:
:class:`DeviceBatches` runs several whole batches per compiled call from arrays held on the device (across the
ends of epochs when every batch has the same size); :class:`FedBatches` runs one update per call, as the feeder
serves batches or sub-batches."""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator

import keras
import numpy as np

from accumrun.core.losses import MetricSet
from accumrun.core.step import Chunk, TrainStep
from accumrun.core.updates import UpdateLoop, Updates
from accumrun.data.feeder import Feeder
from accumrun.data.resident import ResidentArrays


class Batches(ABC):
    """The batches of every epoch, each planned as its chunks' sizes (``plan``), trained a call at a time."""

    def __init__(self, plan: list[list[int]]) -> None:
        self.plan = plan
        self.sizes = [sum(chunks) for chunks in plan]
        """Each batch's sample count."""

    @abstractmethod
    def most_per_call(self, batch: int) -> int:
        """The most updates one call can run from batch ``batch`` of an epoch on (maybe into the next epochs)."""

    @abstractmethod
    def run(self, epoch: int, batch: int, count: int) -> Updates:
        """Train ``count`` batches from batch ``batch`` of ``epoch`` (0-based) on, in one call."""

    @property
    def traces(self) -> int:
        """How many times the compiled calls were traced so far."""
        return 0


class DeviceBatches(Batches):
    """Whole batches gathered on the device from ``data``, several updates per compiled call (``loop``)."""

    def __init__(self, plan: list[list[int]], data: ResidentArrays, loop: UpdateLoop) -> None:
        super().__init__(plan)
        self._data = data
        self._loop = loop
        # A call runs batches of one size: all of an epoch's, or its full ones, then its short last one.
        self._uniform = len(set(self.sizes)) == 1

    def most_per_call(self, batch: int) -> int:
        if self._uniform:
            return np.iinfo(np.int32).max
        same = itertools.takewhile(lambda size: size == self.sizes[batch], self.sizes[batch:])
        return sum(1 for _ in same)

    def run(self, epoch: int, batch: int, count: int) -> Updates:
        last = len(self.sizes) - 1
        positions = [divmod(batch + k, len(self.sizes)) for k in range(count)]
        rows = np.stack([self._data.chunk_rows(epoch + e, b) for e, b in positions])
        starts = np.array([b == 0 for _, b in positions])
        ends = np.array([b == last for _, b in positions])
        return self._loop(rows, starts, ends)

    @property
    def traces(self) -> int:
        return self._loop.traces


class FedBatches(Batches):
    """Batches as ``feeder`` serves them, one update per call of ``step``; metrics are reset and read on the host."""

    def __init__(
        self,
        plan: list[list[int]],
        feeder: Feeder,
        step: TrainStep,
        *,
        metrics: MetricSet,
        optimizer: keras.optimizers.Optimizer,
    ) -> None:
        super().__init__(plan)
        self._feeder = feeder
        self._step = step
        self._metrics = metrics
        self._optimizer = optimizer
        # The epoch's chunks, kept between calls: (epoch, the next batch, the chunks from it on).
        self._open: tuple[int, int, Iterator[Chunk]] | None = None

    def most_per_call(self, batch: int) -> int:
        return 1

    def run(self, epoch: int, batch: int, count: int) -> Updates:
        if count != 1:
            raise ValueError("fed batches run one update per call")
        if batch == 0:
            self._metrics.reset()
        # The open chunks when they are next (one tf.data iterator serves the epoch), else new ones.
        if self._open is not None and self._open[:2] == (epoch, batch):
            chunks = self._open[2]
        else:
            chunks = self._feeder.epoch(epoch, skip=sum(len(sizes) for sizes in self.plan[:batch]))
        result = self._step.train_batch(itertools.islice(chunks, len(self.plan[batch])), self.sizes[batch])
        self._open = (epoch, batch + 1, chunks)
        ends = batch == len(self.plan) - 1
        optimizer = self._optimizer
        metrics = list(self._metrics.results().values()) if ends else [0.0] * len(self._metrics.names)
        return Updates(
            loss_sums=np.array([float(result.loss_sum)], np.float64),
            units=np.array([float(result.units)], np.float64),
            applied=np.array([bool(result.applied)]),
            # Not float(): a Keras variable over a tf.distribute (mirrored) variable does not convert that way.
            learning_rates=np.array([keras.ops.convert_to_numpy(optimizer.learning_rate)], np.float32),
            optimizer_steps=np.array([int(optimizer.iterations.numpy())], np.int64),
            metrics=np.array([metrics], np.float64).reshape(1, len(self._metrics.names)),
            measures=result.measures.numpy()[np.newaxis],
        )
