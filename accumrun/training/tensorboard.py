"""TensorBoard scalars for a run: one point per epoch, and optionally one per N optimizer updates."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from accumrun.training.hooks import BatchEnd, EpochEnd, Hook

# Per-epoch values besides the loss and the row's figures that are worth a curve; the rest of a row is bookkeeping.
_OTHER_SCALARS = ("samples_per_second", "learning_rate")


class TensorBoardLog(Hook):
    """Writes scalars under ``run_dir/tensorboard``; does nothing when disabled. An epoch's curves are its loss,
    every figure of its row (the metrics and their ``val_`` twins, and whatever each feature's hook added), its speed
    and its learning rate."""

    def __init__(self, run_dir: Path, enabled: bool, every_updates: int | None) -> None:
        self._writer = tf.summary.create_file_writer(str(run_dir / "tensorboard")) if enabled else None
        self._every_updates = every_updates

    def on_batch_end(self, batches: BatchEnd) -> None:
        """Log the mean loss of each applied update whose optimizer step ``every_updates`` divides."""
        if self._writer is None or not self._every_updates:
            return
        updates = batches.updates
        for loss_sum, units, applied, step in zip(
            updates.loss_sums, updates.units, updates.applied, updates.optimizer_steps, strict=True
        ):
            if applied and not int(step) % self._every_updates:
                with self._writer.as_default(step=int(step)):
                    tf.summary.scalar("update/loss", float(loss_sum) / float(units))

    def on_epoch_end(self, end: EpochEnd) -> None:
        """Log the epoch's row, with the epoch number as the step."""
        if self._writer is None:
            return
        logged = end.row.to_json()
        with self._writer.as_default(step=end.row.epoch):
            for key in ("loss", *end.row.figures, *_OTHER_SCALARS):
                if key in logged:
                    tf.summary.scalar(f"epoch/{key}", logged[key])
        self._writer.flush()

    def on_stop(self, stopped: str | None) -> None:
        if self._writer is not None:
            self._writer.close()
