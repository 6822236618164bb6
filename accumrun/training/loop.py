"""The Trainer: batches through the step, in the seed's order, from a position to the last epoch (or an early
stop), returning the epochs' rows.

After every batch the trainer counts what the step returned, applies the non-finite policy and honours a stop
request; after every epoch it validates, applies the controls (early stopping, the best model, the learning
rate), records the row and checkpoints. What each of those does lives elsewhere: the row and its destinations in
:mod:`.log`, the validation pass in :class:`accumrun.objective.Scorer`, the decisions in :mod:`.controls`, the
files in :mod:`.checkpoints`. The trainer knows nothing of the config or the run folder: it gets the pieces it
uses.
"""

from __future__ import annotations

import itertools
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from accumrun.core.losses import MetricSet
from accumrun.core.step import TrainStep
from accumrun.data.feeder import Feeder
from accumrun.errors import Interrupted, TrainingDiverged
from accumrun.kinds import OnNonFinite
from accumrun.rundir.metrics import EpochRow
from accumrun.training.checkpoints import CheckpointStore, Position
from accumrun.training.console import progress_bar
from accumrun.training.controls import Controls
from accumrun.training.log import RowSizes, RunLog, epoch_row
from accumrun.training.signals import StopRequests


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """What the trainer does when: the epochs, the checkpoints between them, and what a non-finite update does."""

    epochs: int
    checkpoint_every_updates: int | None
    on_nonfinite: OnNonFinite


@dataclass(frozen=True, kw_only=True)
class Trainer:
    """Fits with ``step`` from a :class:`Position`, checkpointing into ``store``, and returns the rows.

    ``step`` gets each batch as the chunks ``feeder`` serves it in (the whole batch, or with ``feed: sub_batch``
    its sub-batches) and makes the batch's one update. ``plan`` is each batch of an epoch as those chunks.
    """

    step: TrainStep
    feeder: Feeder
    plan: list[list[int]]
    sizes: RowSizes
    optimizer: keras.optimizers.Optimizer
    train_metrics: MetricSet
    schedule: Schedule
    validate: Callable[[], dict[str, float]] | None
    """``val_loss`` and ``val_<metric>`` under the current weights; None without validation data."""
    end_of_epoch: Callable[[], None] | None
    """Run before validation (``batch_norm: precise`` recomputes the population statistics); or None."""
    save_best: Callable[[], object]
    """Save the model as the best so far."""
    store: CheckpointStore
    log: RunLog
    controls: Controls
    agree: Callable[[int | None], int | None]
    """The stop that every worker agrees on (see :func:`accumrun.training.distribute.stop_agreement`)."""
    resume_command: str
    echo: Callable[[str], None]
    show_progress: bool = True

    def fit(self, position: Position) -> list[EpochRow]:
        """Train from ``position`` to the last epoch, or until early stopping (the last row says why); return
        every row of the run, those a resumed run kept included.

        Raises:
            Interrupted: a stop was requested; the checkpoint at the batch boundary is saved.
            TrainingDiverged: a non-finite loss or gradient with ``training.on_nonfinite: stop``.
        """
        stopped = None
        with StopRequests() as stops:
            while position.epoch < self.schedule.epochs and stopped is None:
                self._train_epoch(position, stops)
                stopped = self._end_epoch(position)
                position = Position(epoch=position.epoch + 1)
                checkpoint = self.store.save(position)
                self._stop(self.agree(stops.signal_number), position, checkpoint)
        if stopped is not None:
            self.echo(stopped)
        self.log.close()
        return self.log.rows

    def _train_epoch(self, position: Position, stops: StopRequests) -> None:
        """Run the epoch's remaining batches, adding them to ``position``."""
        every = self.schedule.checkpoint_every_updates
        bar = (
            progress_bar(len(self.plan), position.epoch, self.schedule.epochs, position.batch)
            if self.show_progress
            else None
        )
        seconds_before, started = position.train_seconds, time.perf_counter()
        if position.batch == 0:
            self.train_metrics.reset()
        for samples, (batch_loss, applied) in self._batches(position.epoch, position.batch):
            position.batch += 1
            position.train_seconds = seconds_before + time.perf_counter() - started
            if not bool(applied):
                self._non_finite(position, float(batch_loss))
            else:
                position.loss_sum += float(batch_loss)
                position.samples += samples
                self.log.update(float(batch_loss) / samples)
                if every and int(self.optimizer.iterations.numpy()) % every == 0:
                    self.store.save(position)
            if bar is not None:
                bar.update(position.batch, loss=position.loss_sum / max(position.samples, 1))
            # Every worker of a multi-worker run stops at the same batch, whichever got the signal.
            number = self.agree(stops.signal_number)
            if number is not None:
                if bar is not None:
                    bar.finish(dirty=True)
                self._stop(number, position, self.store.save(position))
        if bar is not None:
            bar.finish(dirty=True)

    def _batches(self, epoch: int, skip: int) -> Iterator[tuple[int, tuple[tf.Tensor, tf.Tensor]]]:
        """Train the epoch's batches after the first ``skip``; yield each one's sample count and what the step
        returned for it: ``(loss_sum, applied)``."""
        plan = self.plan
        chunks = self.feeder.epoch(epoch, skip=sum(len(sizes) for sizes in plan[:skip]))
        for sizes in plan[skip:]:
            samples = sum(sizes)
            yield samples, self.step.train_batch(itertools.islice(chunks, len(sizes)), samples)

    def _end_epoch(self, position: Position) -> str | None:
        """Validate, record the row of the epoch that ``position`` has just finished and apply the controls;
        return why training stops here, if it does."""
        started = time.perf_counter()
        if self.end_of_epoch is not None:
            # Before validation and the epoch's checkpoint, which then hold what it computes.
            self.end_of_epoch()
        validation = self.validate() if self.validate is not None else {}
        optimizer = self.optimizer
        # Not float(): a Keras variable over a tf.distribute (mirrored) variable does not convert that way.
        learning_rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        row = epoch_row(
            position,
            {**self.train_metrics.results(), **validation},
            position.train_seconds + time.perf_counter() - started,
            sizes=self.sizes,
            optimizer_steps=int(optimizer.iterations.numpy()),
            loss_scaled=self._loss_scaled,
            learning_rate=learning_rate,
        )
        decision = self.controls.after_epoch(row, learning_rate)
        self.log.epoch(row, stopped=decision.stop)
        for note in decision.notes:
            self.echo(note)
        if decision.keep_best:
            self.save_best()
        if decision.learning_rate is not None:
            optimizer.learning_rate = decision.learning_rate
        return decision.stop

    @property
    def _loss_scaled(self) -> bool:
        return isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)

    def _non_finite(self, position: Position, batch_loss: float) -> None:
        if self._loss_scaled and math.isfinite(batch_loss):
            # Overflow of the scaled float16 gradients: the optimizer lowered its loss scale; this is routine.
            position.loss_scale_skips += 1
            return
        what = f"the loss is {batch_loss}" if not math.isfinite(batch_loss) else "a gradient is NaN or Inf"
        where = f"at epoch {position.epoch + 1}, batch {position.batch}"
        if self.schedule.on_nonfinite is OnNonFinite.SKIP_BATCH:
            position.skipped_batches += 1
            self.echo(f"{what} {where}; skipped that batch's update (training.on_nonfinite: skip_batch)")
            return
        latest = self.store.latest()
        kept = f"the last good checkpoint is {latest}" if latest else "no checkpoint was taken yet"
        raise TrainingDiverged(f"training diverged: {what} {where}; that update was not applied, and {kept}")

    def _stop(self, signal_number: int | None, position: Position, checkpoint: Path) -> None:
        """Raise :class:`Interrupted` after ``checkpoint`` when a stop was asked for (``signal_number``)."""
        if signal_number is None:
            return
        name = signal.Signals(signal_number).name
        epoch, batch = position.counted(len(self.plan))
        reason = f"{name} at epoch {epoch}, batch {batch}; saved {checkpoint}"
        raise Interrupted(signal_number, reason, self.resume_command)
