"""The Trainer: batches through the step, in the seed's order, from a position to the last epoch (or an early
stop), returning the epochs' rows.

The trainer runs the batches a call at a time (:mod:`.batches`): one update per call, or where the data is held on
the device several, as many as :mod:`.cadence` allows before the host is needed. After each call it counts what
every update returned, applies the non-finite policy, and ends the epochs that ended in it: an epoch that ends a
call may validate and apply the controls (early stopping, the best model, the learning rate); every epoch records
its row. Then it checkpoints when one is due, and honours a stop request. What each of those does lives
elsewhere: the row and its destinations in :mod:`.log`, the validation pass in
:class:`accumrun.objective.Scorer`, the decisions in :mod:`.controls`, the files in :mod:`.checkpoints`. The
trainer knows nothing of the config or the run folder: it gets the pieces it uses.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import keras
import progressbar

from accumrun.core.updates import Updates
from accumrun.errors import Interrupted, TrainingDiverged
from accumrun.kinds import OnNonFinite
from accumrun.rundir.metrics import EpochRow
from accumrun.training.batches import Batches
from accumrun.training.cadence import Cadence
from accumrun.training.checkpoints import CheckpointStore, Position
from accumrun.training.console import progress_bar
from accumrun.training.controls import Controls
from accumrun.training.distribute import Agreed, Agreement
from accumrun.training.log import RowSizes, RunLog, epoch_row
from accumrun.training.signals import StopRequests


@dataclass(kw_only=True)
class _Clock:
    """What the trainer times: the last checkpoint, and the size of the next call (agreed by every worker)."""

    last_checkpoint: float = field(default_factory=time.monotonic)
    seconds_per_update: float | None = None
    """What an update costs, once a call has been timed (a call that traced is not)."""
    call_size: int = 1


@dataclass(frozen=True, kw_only=True)
class Trainer:
    """Fits ``batches`` from a :class:`Position`, checkpointing into ``store``, and returns the rows."""

    batches: Batches
    sizes: RowSizes
    optimizer: keras.optimizers.Optimizer
    metric_names: list[str]
    cadence: Cadence
    on_nonfinite: OnNonFinite
    validate: Callable[[], dict[str, float]] | None
    """``val_loss`` and ``val_<metric>`` under the current weights; None without validation data."""
    end_of_epoch: Callable[[], None] | None
    """Run before validation (``batch_norm: precise`` recomputes the population statistics); or None."""
    save_best: Callable[[], object]
    """Save the model as the best so far."""
    store: CheckpointStore
    log: RunLog
    controls: Controls
    agree: Agreement
    """What every worker does after a call: stop, the next call's size, a checkpoint (see
    :func:`accumrun.training.distribute.agreement`)."""
    resume_command: str
    echo: Callable[[str], None]
    show_progress: bool = True
    _clock: _Clock = field(default_factory=_Clock, init=False)
    _bars: dict[int, progressbar.ProgressBar | None] = field(default_factory=dict, init=False)

    def fit(self, position: Position) -> list[EpochRow]:
        """Train from ``position`` to the last epoch, or until early stopping (the last row says why); return
        every row of the run, those a resumed run kept included.

        Raises:
            Interrupted: a stop was requested; the checkpoint at the batch boundary is saved.
            TrainingDiverged: a non-finite loss or gradient with ``training.on_nonfinite: stop``.
        """
        stopped = None
        self._clock.last_checkpoint = time.monotonic()
        self._clock.call_size = self.cadence.wanted(None)
        with StopRequests() as stops, contextlib.ExitStack() as bars:
            bars.callback(self._finish_bar)  # before the run's last words, however it ends
            while position.epoch < self.cadence.epochs and stopped is None:
                updates, seconds = self._call(position)
                position, stopped = self._take(updates, seconds, position)
                ended = stopped is not None or position.epoch >= self.cadence.epochs
                # Every worker of a multi-worker run does the same after the same call, whichever got the signal.
                agreed = self.agree(
                    Agreed(
                        stops.signal_number,
                        self.cadence.wanted(self._clock.seconds_per_update),
                        self._checkpoint_due(position, updates),
                    )
                )
                self._clock.call_size = agreed.call_size
                if agreed.signal_number is not None or ended or agreed.checkpoint:
                    checkpoint = self._checkpoint(position)
                    # A run that has just ended completes (its model saved) rather than stop: there is nothing
                    # left to resume.
                    if not ended:
                        self._stop(agreed.signal_number, position, checkpoint)
        if stopped is not None:
            self.echo(stopped)
        self.log.close()
        return self.log.rows

    def _call(self, position: Position) -> tuple[Updates, float]:
        """Run the next call's updates from ``position``; return what they gave and the call's wall time."""
        batches, cadence = self.batches, self.cadence
        steps = int(self.optimizer.iterations.numpy())
        count = cadence.call_size(
            self._clock.call_size,
            cadence.updates_until_host(position.epoch, position.batch, steps),
            batches.most_per_call(position.batch),
            batches.sizes[position.batch],
        )
        traces, started = batches.traces, time.perf_counter()
        updates = batches.run(position.epoch, position.batch, count)
        seconds = time.perf_counter() - started
        if batches.traces == traces:  # a call that traced timed the tracing, not the work
            self._clock.seconds_per_update = seconds / len(updates.applied)
        return updates, seconds

    def _take(self, updates: Updates, seconds: float, position: Position) -> tuple[Position, str | None]:
        """Count the call's ``updates`` into ``position`` (the call's ``seconds`` shared among them) and end the
        epochs that ended in it; return the position after them, and why training stops there, if it does."""
        stopped = None
        for k, (loss_sum, units, applied) in enumerate(
            zip(updates.loss_sums, updates.units, updates.applied, strict=True)
        ):
            samples = self.batches.sizes[position.batch]
            position.batch += 1
            position.train_seconds += seconds / len(updates.applied)
            if not applied:
                self._non_finite(position, float(loss_sum))
            else:
                position.loss_sum += float(loss_sum)
                position.units += float(units)
                position.samples += samples
                position.timed_samples += samples
                self.log.update(float(loss_sum) / float(units), int(updates.optimizer_steps[k]))
            self._show(position)
            if position.batch == len(self.batches.sizes):
                # Only the call's last epoch may validate, apply the controls, or stop (see the cadence).
                assert stopped is None, "an epoch that stops training must end its call"
                stopped = self._end_epoch(position, updates, k)
                position = Position(epoch=position.epoch + 1)
        return position, stopped

    def _show(self, position: Position) -> None:
        """Move the epoch's progress bar (on a terminal, for epochs of more than one batch)."""
        count = len(self.batches.sizes)
        if not self.show_progress or count == 1:
            return
        if position.epoch not in self._bars:
            self._finish_bar()
            self._bars[position.epoch] = progress_bar(count, position.epoch, self.cadence.epochs, position.batch - 1)
        bar = self._bars[position.epoch]
        if bar is not None:
            bar.update(position.batch, loss=position.loss_sum / max(position.units, 1.0))
        if position.batch == count:
            self._finish_bar()

    def _finish_bar(self) -> None:
        for bar in self._bars.values():
            if bar is not None:
                bar.finish(dirty=True)
        self._bars.clear()

    def _end_epoch(self, position: Position, updates: Updates, k: int) -> str | None:
        """Record the row of the epoch that ``position`` has just finished, at update ``k`` of ``updates``: its
        training metrics, and where the epoch ended the call, its validation and the controls' decisions; return
        why training stops here, if it does."""
        started = time.perf_counter()
        ends_call = k == len(updates.applied) - 1
        validation: dict[str, float] = {}
        if ends_call:
            if self.end_of_epoch is not None:
                # Before validation and the epoch's checkpoint, which then hold what it computes.
                self.end_of_epoch()
            if self.validate is not None and self.cadence.validates_after(position.epoch):
                validation = self.validate()
        learning_rate = float(updates.learning_rates[k])
        metrics = dict(zip(self.metric_names, (float(value) for value in updates.metrics[k]), strict=True))
        row = epoch_row(
            position,
            {**metrics, **validation},
            position.train_seconds + time.perf_counter() - started,
            sizes=self.sizes,
            optimizer_steps=int(updates.optimizer_steps[k]),
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
            self.optimizer.learning_rate = decision.learning_rate
        return decision.stop

    def _checkpoint_due(self, position: Position, updates: Updates) -> bool:
        """Whether the call just run ends where a checkpoint is due: the end of an epoch (``checkpoint_every:
        null``), ``checkpoint_every`` since the last, or an update count that ``checkpoint_every_updates``
        divides."""
        cadence = self.cadence
        if cadence.checkpoint_seconds is None:
            if position.batch == 0:
                return True
        elif time.monotonic() - self._clock.last_checkpoint >= cadence.checkpoint_seconds:
            return True
        every = cadence.checkpoint_every_updates
        return bool(every and updates.applied[-1] and int(updates.optimizer_steps[-1]) % every == 0)

    def _checkpoint(self, position: Position) -> Path:
        """Save a checkpoint at ``position``, the rows logged so far forced to disk first."""
        self.log.sync()
        self._clock.last_checkpoint = time.monotonic()
        return self.store.save(position)

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
        if self.on_nonfinite is OnNonFinite.SKIP_BATCH:
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
        epoch, batch = position.counted(len(self.batches.sizes))
        reason = f"{name} at epoch {epoch}, batch {batch}; saved {checkpoint}"
        raise Interrupted(signal_number, reason, self.resume_command)
