"""An epoch's batches through the step, one call at a time, as :class:`~accumrun.core.updates.Updates` either way:
:class:`DeviceBatches` runs several whole batches per compiled call, from arrays held on the device or from each
call's batches read for it (across the ends of epochs when every batch has the same size); :class:`FedBatches`
runs one update per call, as the feeder serves batches or sub-batches."""

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

STAGED_BYTES = 2**27
"""The most bytes of samples one call's batches, read for it, take (one call's and the next one's are held)."""


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
    """Whole batches, several updates per compiled call (``loop``): gathered on the device from the arrays the
    feeder holds there, or, where it :attr:`~accumrun.data.feeder.Feeder.gathers` instead, from the call's batches,
    read in one gather each, the next call's while this one trains."""

    def __init__(self, plan: list[list[int]], feeder: Feeder, loop: UpdateLoop) -> None:
        super().__init__(plan)
        self._feeder = feeder
        self._loop = loop
        # A call runs batches of one size: all of an epoch's, or its full ones, then its short last one.
        self._uniform = len(set(self.sizes)) == 1
        # Batches read for a call are held twice at most (the call's, and the next call's read ahead).
        source = feeder.source
        self._held = max(
            1, STAGED_BYTES // (max(self.sizes) * int(np.prod(source.sample_shape)) * source.dtype.itemsize)
        )
        self._most_read = 1

    def most_per_call(self, batch: int) -> int:
        most = np.iinfo(np.int32).max if self._feeder.resident is not None else self._held
        if self._uniform:
            return most
        same = itertools.takewhile(lambda size: size == self.sizes[batch], self.sizes[batch:])
        return min(most, sum(1 for _ in same))

    def run(self, epoch: int, batch: int, count: int) -> Updates:
        positions = self._positions(epoch, batch, count)
        last = len(self.sizes) - 1
        starts = np.array([b == 0 for _, b in positions])
        ends = np.array([b == last for _, b in positions])
        resident = self._feeder.resident
        if resident is not None:
            return self._loop(np.stack([resident.chunk_rows(e, b) for e, b in positions]), starts, ends)
        # The next call is read ahead as if as long as the longest so far: a shorter one takes what it needs.
        self._most_read = max(self._most_read, count)
        following = divmod(batch + count, len(self.sizes))
        then = self._positions(
            epoch + following[0], following[1], min(self._most_read, self.most_per_call(following[1]))
        )
        data = self._feeder.read(positions, then)
        rows = np.arange(count * self.sizes[batch], dtype=np.int32).reshape(count, self.sizes[batch])
        return self._loop(rows, starts, ends, data)

    def _positions(self, epoch: int, batch: int, count: int) -> list[tuple[int, int]]:
        """The ``(epoch, batch)`` of ``count`` batches from batch ``batch`` of ``epoch`` on."""
        return [(epoch + e, b) for e, b in (divmod(batch + k, len(self.sizes)) for k in range(count))]

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
