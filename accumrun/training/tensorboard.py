"""TensorBoard scalars for a run: one point per epoch, and optionally one per N optimizer updates."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from accumrun.rundir.metrics import EpochRow
from accumrun.training.hooks import BatchEnd, EpochEnd, Hook

# Per-epoch values besides the loss and the metrics that are worth a curve; the rest of a row is bookkeeping.
_OTHER_SCALARS = ("samples_per_second", "learning_rate")


class TensorBoardLog(Hook):
    """Writes scalars under ``run_dir/tensorboard``; does nothing when disabled."""

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        every_updates: int | None,
        metric_names: list[str],
    ) -> None:
        self._writer = tf.summary.create_file_writer(str(run_dir / "tensorboard")) if enabled else None
        self._every_updates = every_updates
        names = ["loss", *metric_names]
        self._scalars = [*names, *(f"val_{name}" for name in names), *_OTHER_SCALARS]

    def on_batch_end(self, batches: BatchEnd) -> None:
        """Log the mean loss of each applied update, every ``every_updates`` optimizer updates."""
        updates = batches.updates
        for loss_sum, units, applied, step in zip(
            updates.loss_sums, updates.units, updates.applied, updates.optimizer_steps, strict=True
        ):
            if applied:
                self.update(float(loss_sum) / float(units), int(step))

    def on_epoch_end(self, end: EpochEnd) -> None:
        self.epoch(end.row)

    def on_stop(self, stopped: str | None) -> None:
        self.close()

    def update(self, batch_loss: float, step: int) -> None:
        """Log the mean loss of an applied batch, whose update made the optimizer's count ``step``, every
        ``every_updates`` optimizer updates."""
        if self._writer is None or not self._every_updates or step % self._every_updates:
            return
        with self._writer.as_default(step=step):
            tf.summary.scalar("update/loss", batch_loss)

    def epoch(self, row: EpochRow) -> None:
        """Log an epoch's metrics row, with the epoch number as the step."""
        if self._writer is None:
            return
        logged = row.to_json()
        with self._writer.as_default(step=row.epoch):
            for key in self._scalars:
                if key in logged:
                    tf.summary.scalar(f"epoch/{key}", logged[key])
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the writer."""
        if self._writer is not None:
            self._writer.close()
