"""The non-finite policy (``training.on_nonfinite``) as a hook: ``skip_batch`` says that an update was not applied
for a NaN or Inf and goes on, ``stop`` ends the run; a loss-scale overflow (a finite loss) passes silently."""

from __future__ import annotations

import math
from collections.abc import Callable

from accumrun.errors import TrainingDiverged
from accumrun.kinds import OnNonFinite
from accumrun.training.checkpoints import CheckpointStore
from accumrun.training.hooks import BatchEnd, Hook


class NonFinitePolicy(Hook):
    """The non-finite policy as a hook."""

    def __init__(
        self, policy: OnNonFinite, *, loss_scaled: bool, store: CheckpointStore, echo: Callable[[str], None]
    ) -> None:
        self._policy = policy
        self._loss_scaled = loss_scaled
        self._store = store
        self._echo = echo

    def on_batch_end(self, batches: BatchEnd) -> None:
        """Say, or stop at, each update not applied for a NaN or Inf.

        Raises:
            TrainingDiverged: a non-finite loss or gradient with ``training.on_nonfinite: stop``.
        """
        for k, (loss_sum, applied) in enumerate(zip(batches.updates.loss_sums, batches.updates.applied, strict=True)):
            batch_loss = float(loss_sum)
            if applied or (self._loss_scaled and math.isfinite(batch_loss)):
                continue
            what = f"the loss is {batch_loss}" if not math.isfinite(batch_loss) else "a gradient is NaN or Inf"
            where = f"at epoch {batches.position.epoch + 1}, batch {batches.batch(k)}"
            if self._policy is OnNonFinite.SKIP_BATCH:
                self._echo(f"{what} {where}; skipped that batch's update (training.on_nonfinite: skip_batch)")
                continue
            latest = self._store.latest()
            kept = f"the last good checkpoint is {latest}" if latest else "no checkpoint was taken yet"
            raise TrainingDiverged(f"training diverged: {what} {where}; that update was not applied, and {kept}")
