"""The Trainer: the loop alone. It runs the batches a call at a time (:mod:`.batches`), as many updates as
:mod:`.cadence` and the hooks allow; after each call it counts the updates, ends the epochs that ended in it (one
row each), and lets every worker agree on what the hooks asked for. Everything else is a hook (:mod:`.hooks`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import keras

from accumrun.core.updates import Updates
from accumrun.rundir.metrics import EpochRow
from accumrun.training.batches import Batches
from accumrun.training.cadence import Cadence
from accumrun.training.checkpoints import Position
from accumrun.training.distribute import Agreed, Agreement
from accumrun.training.hooks import BatchEnd, CallEnd, EpochEnd, Hooks, updates_slice
from accumrun.training.log import RowSizes, epoch_row


@dataclass(kw_only=True)
class _Clock:
    """The size of the next call (agreed by every worker), and what an update costs."""

    seconds_per_update: float | None = None
    """What an update costs, once a call has been timed (a call that traced is not)."""
    call_size: int = 1


@dataclass(frozen=True, kw_only=True)
class Trainer:
    """Fits ``batches`` from a :class:`Position`, calling ``hooks`` at the named points, and returns the rows."""

    batches: Batches
    sizes: RowSizes
    optimizer: keras.optimizers.Optimizer
    metric_names: list[str]
    cadence: Cadence
    hooks: Hooks
    """Every concern besides the loop (several as one: :class:`~accumrun.training.hooks.Hooks`)."""
    agree: Agreement
    rows: list[EpochRow] = field(default_factory=list)
    """Every epoch's row so far, those a resumed run kept included; :meth:`fit` adds its own."""
    _clock: _Clock = field(default_factory=_Clock, init=False)

    def fit(self, position: Position) -> list[EpochRow]:
        """Train from ``position`` to the last epoch, or until a hook stops it; return every row of the run.

        Raises:
            Interrupted: a stop was requested; the checkpoint at the batch boundary is saved.
            TrainingDiverged: a non-finite loss or gradient with ``training.on_nonfinite: stop``.
        """
        stopped = None
        self._clock.call_size = self.cadence.wanted(None)
        try:
            self.hooks.on_run_start(position)
            while position.epoch < self.cadence.epochs and stopped is None:
                updates, seconds = self._call(position)
                position, stopped = self._take(updates, seconds, position)
                ended = stopped is not None or position.epoch >= self.cadence.epochs
                self._host(CallEnd(position=position, updates=updates, ended=ended))
        except BaseException:
            # The hooks still let go (bars, signal handlers, files), but the run's own exception is what surfaces.
            with contextlib.suppress(Exception):
                self.hooks.on_stop(None)
            raise
        self.hooks.on_stop(stopped)
        return self.rows

    def _call(self, position: Position) -> tuple[Updates, float]:
        """Run the next call's updates from ``position``; return what they gave and the call's wall time."""
        batches, cadence = self.batches, self.cadence
        steps = int(self.optimizer.iterations.numpy())
        until_host = cadence.updates_until_host(position.epoch, position.batch, steps)
        asked = self.hooks.end_call_at(position, steps)
        if asked is not None:
            until_host = min(until_host, max(1, asked - steps))
        count = cadence.call_size(
            self._clock.call_size, until_host, batches.most_per_call(position.batch), batches.sizes[position.batch]
        )
        traces, started = batches.traces, time.perf_counter()
        updates = batches.run(position.epoch, position.batch, count)
        seconds = time.perf_counter() - started
        if batches.traces == traces:  # a call that traced timed the tracing, not the work
            self._clock.seconds_per_update = seconds / len(updates.applied)
        return updates, seconds

    def _take(self, updates: Updates, seconds: float, position: Position) -> tuple[Position, str | None]:
        """Count the call's ``updates`` into ``position`` an epoch's part at a time, ending the epochs that ended in
        it (the call's ``seconds`` shared evenly); return the position after them, and why training stops there."""
        stopped = None
        count, per_epoch = len(updates.applied), len(self.batches.sizes)
        start = 0
        while start < count:
            end = min(count, start + per_epoch - position.batch)
            first_batch = position.batch
            for k in range(start, end):
                samples = self.batches.sizes[position.batch]
                position.batch += 1
                position.train_seconds += seconds / count
                if updates.applied[k]:
                    position.loss_sum += float(updates.loss_sums[k])
                    position.units += float(updates.units[k])
                    position.samples += samples
                    position.timed_samples += samples
                elif self._loss_scaled and math.isfinite(float(updates.loss_sums[k])):
                    # Overflow of the scaled float16 gradients: the optimizer lowered its loss scale; this is routine.
                    position.loss_scale_skips += 1
                else:
                    # The non-finite policy (a hook) says whether training goes on past it.
                    position.skipped_batches += 1
            self.hooks.on_batch_end(
                BatchEnd(updates=updates_slice(updates, start, end), first_batch=first_batch, position=position)
            )
            if position.batch == per_epoch:
                # Only the call's last epoch may validate, apply the controls, or stop (see the cadence).
                assert stopped is None, "an epoch that stops training must end its call"
                stopped = self._end_epoch(position, updates, end - 1)
                position = Position(epoch=position.epoch + 1, carried_measures=position.carried_measures)
            start = end
        return position, stopped

    def _end_epoch(self, position: Position, updates: Updates, k: int) -> str | None:
        """Record the row of the epoch just finished at update ``k``; return why training stops here, if it does."""
        started = time.perf_counter()
        ends_call = k == len(updates.applied) - 1
        metrics = dict(zip(self.metric_names, (float(value) for value in updates.metrics[k]), strict=True))
        figures = {**metrics, **self.hooks.epoch_figures(position, ends_call)}
        row = epoch_row(
            position,
            figures,
            position.train_seconds + time.perf_counter() - started,
            measure_seconds=self.hooks.measuring_seconds,
            sizes=self.sizes,
            optimizer_steps=int(updates.optimizer_steps[k]),
            loss_scaled=self._loss_scaled,
            learning_rate=float(updates.learning_rates[k]),
        )
        end = EpochEnd(row=row)
        self.hooks.on_epoch_end(end)
        self.rows.append(end.row)
        return end.row.stopped

    def _host(self, call: CallEnd) -> None:
        """After ``call``: the hooks ask, every worker agrees (whichever got the signal), the hooks act."""
        self.hooks.on_call_end(call)
        agreed = self.agree(
            Agreed(call.signal_number, self.cadence.wanted(self._clock.seconds_per_update), call.checkpoint)
        )
        self._clock.call_size = agreed.call_size
        call.signal_number, call.checkpoint = agreed.signal_number, agreed.checkpoint
        self.hooks.on_agreed(call)

    @property
    def _loss_scaled(self) -> bool:
        return isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
