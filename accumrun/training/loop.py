"""The epoch loop: batches through the step, in the seed's order, from a position to the last epoch (or an early
stop).

After every batch the loop counts what the step returned, applies the non-finite policy and honours a stop
request; after every epoch it validates, applies the controls (early stopping, the best model, the learning
rate), records the row and checkpoints. What each of those does lives elsewhere: the row and its destinations in
:mod:`.log`, validation in :mod:`.evaluation`, the decisions in :mod:`.controls`, the files in :mod:`.checkpoints`.
"""

from __future__ import annotations

import itertools
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import keras
import tensorflow as tf

from accumrun.core.batch_norm import PopulationStatistics
from accumrun.core.split import replica_sub_batch_sizes
from accumrun.core.step import TrainStep
from accumrun.data.feeder import Feeder
from accumrun.errors import Interrupted, TrainingDiverged
from accumrun.training.checkpoints import CheckpointStore, Position
from accumrun.training.console import progress_bar
from accumrun.training.controls import Controls
from accumrun.training.distribute import stop_agreement
from accumrun.training.evaluation import Validation
from accumrun.training.log import RunLog, epoch_row
from accumrun.training.saving import save_trained_model
from accumrun.training.setup import TrainingSetup
from accumrun.training.signals import StopRequests, resume_command


@dataclass(kw_only=True)
class EpochLoop:
    """Trains ``setup`` with ``train_step`` (compiled for ``subdivisions``), checkpointing into ``store``.

    ``train_step`` gets each batch as the chunks the feeder serves it in (the whole batch, or with
    ``data.feed: sub_batch`` its sub-batches) and makes the batch's update.
    """

    setup: TrainingSetup
    train_step: TrainStep
    subdivisions: int
    run_dir: Path
    """Where this process writes (a scratch folder on a multi-worker run's other workers)."""
    run_home: Path
    """The run's directory, which a resume names."""
    store: CheckpointStore
    log: RunLog
    controls: Controls
    echo: Callable[[str], None]
    show_progress: bool = True
    feeder: Feeder = field(init=False)
    plan: list[list[int]] = field(init=False)
    """Each batch of an epoch as the chunks the feeder serves: one whole batch, or its sub-batches."""
    sub_batch_size: int = field(init=False)
    validation: Validation | None = field(init=False)

    def __post_init__(self) -> None:
        setup = self.setup
        dataset = setup.dataset
        self.plan = setup.chunk_sizes(self.subdivisions)
        self.feeder = setup.train_feeder([size for sizes in self.plan for size in sizes])
        # The largest sub-batch one device runs: the batch is dealt out to the replicas before it is cut.
        self.sub_batch_size = max(replica_sub_batch_sizes(setup.batch_size, setup.replicas, self.subdivisions))
        self.validation = Validation(setup, self.sub_batch_size) if dataset.val_size else None
        self.agree = stop_agreement(setup.strategy)
        precise = setup.batch_norm.mode == "precise" and setup.batch_norm.records
        self.population_statistics = (
            PopulationStatistics(setup.model, setup.batch_norm, self.sub_batch_size, setup.strategy)
            if precise
            else None
        )

    @property
    def _optimizer(self) -> keras.optimizers.Optimizer:
        return self.setup.optimizer

    def run(self, position: Position, stops: StopRequests) -> str | None:
        """Train from ``position`` to the last epoch, or until early stopping; return why it stopped early.

        Raises:
            Interrupted: a stop was requested; the checkpoint at the batch boundary is saved.
            TrainingDiverged: a non-finite loss or gradient with ``training.on_nonfinite: stop``.
        """
        epochs = self.setup.config.training.epochs
        stopped = None
        while position.epoch < epochs and stopped is None:
            self._train_epoch(position, stops)
            stopped = self._end_epoch(position)
            position = Position(epoch=position.epoch + 1)
            checkpoint = self.store.save(position)
            self._stop(self.agree(stops.signal_number), position, checkpoint)
        if stopped is not None:
            self.echo(stopped)
        self.log.close()
        return stopped

    def _train_epoch(self, position: Position, stops: StopRequests) -> None:
        """Run the epoch's remaining batches, adding them to ``position``."""
        config = self.setup.config
        every = config.output.checkpoint_every_updates
        batches = len(self.plan)
        bar = (
            progress_bar(batches, position.epoch, config.training.epochs, position.batch)
            if self.show_progress
            else None
        )
        seconds_before, started = position.train_seconds, time.perf_counter()
        if position.batch == 0:
            self.setup.train_metrics.reset()
        for samples, (batch_loss, applied) in self._batches(position.epoch, position.batch):
            position.batch += 1
            position.train_seconds = seconds_before + time.perf_counter() - started
            if not bool(applied):
                self._non_finite(position, float(batch_loss))
            else:
                position.loss_sum += float(batch_loss)
                position.samples += samples
                self.log.update(float(batch_loss) / samples)
                if every and int(self._optimizer.iterations.numpy()) % every == 0:
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
            yield samples, self.train_step.train_batch(itertools.islice(chunks, len(sizes)), samples)

    def _end_epoch(self, position: Position) -> str | None:
        """Validate, record the row of the epoch that ``position`` has just finished and apply the controls;
        return why training stops here, if it does."""
        started = time.perf_counter()
        setup = self.setup
        if self.population_statistics is not None:
            # Before validation and the epoch's checkpoint, which then hold the population statistics.
            # Whole batches, cut on the device, when they fit; else the sub-batches one at a time.
            chunk = setup.batch_size if setup.feed == "batch" else self.sub_batch_size
            self.population_statistics(setup.population_chunks(chunk))
        validation = self.validation() if self.validation is not None else {}
        optimizer = self._optimizer
        row = epoch_row(
            position,
            self.setup.train_metrics.results(),
            validation,
            position.train_seconds + time.perf_counter() - started,
            batch_size=self.setup.batch_size,
            subdivisions=self.subdivisions,
            replicas=self.setup.replicas,
            sub_batch_size=self.sub_batch_size,
            optimizer_steps=int(optimizer.iterations.numpy()),
            skipped_batches=position.skipped_batches,
            **({"loss_scale_skips": position.loss_scale_skips} if self._loss_scaled else {}),
            # Not float(): a Keras variable over a tf.distribute (mirrored) variable does not convert that way.
            learning_rate=float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
        )
        decision = self.controls.after_epoch(row, row["learning_rate"])
        if decision.stop is not None:
            row["stopped"] = decision.stop
        self.log.epoch(row)
        for note in decision.notes:
            self.echo(note)
        if decision.keep_best:
            save_trained_model(self.setup, self.run_dir / "model.best.keras")
        if decision.learning_rate is not None:
            optimizer.learning_rate = decision.learning_rate
        return decision.stop

    @property
    def _loss_scaled(self) -> bool:
        return isinstance(self._optimizer, keras.optimizers.LossScaleOptimizer)

    def _non_finite(self, position: Position, batch_loss: float) -> None:
        if self._loss_scaled and math.isfinite(batch_loss):
            # Overflow of the scaled float16 gradients: the optimizer lowered its loss scale; this is routine.
            position.loss_scale_skips += 1
            return
        what = f"the loss is {batch_loss}" if not math.isfinite(batch_loss) else "a gradient is NaN or Inf"
        where = f"at epoch {position.epoch + 1}, batch {position.batch}"
        if self.setup.config.training.on_nonfinite == "skip_batch":
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
        raise Interrupted(signal_number, reason, resume_command(self.run_home))
