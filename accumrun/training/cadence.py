"""Where a call of several updates must end: where the run needs the host, at the end of an epoch that validates,
that measures the sharpness, that a control decides at, that ``batch_norm: precise`` recomputes statistics after,
that ends the run, or that checkpoints; at an update count that ``checkpoint_every_updates`` divides; and, with
``updates_per_call: auto``, after about :data:`CALL_SECONDS` of work, so that a signal or a timed checkpoint waits
about that long at most (or one update, where an update takes longer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CALL_SECONDS = 0.5
"""What ``updates_per_call: auto`` sizes a call to."""
MOST_ROWS_PER_CALL = 2**24
"""The most row indices one call takes (64 MiB of int32), whatever the batch size."""


@dataclass(frozen=True, kw_only=True)
class Cadence:
    """What a run does between updates, and how often."""

    epochs: int
    batches_per_epoch: int
    validate_every: int
    validates: bool
    """Whether there is validation data."""
    every_epoch_end: bool
    """Whether every epoch's end needs the host (a control of a training figure, precise BatchNorm, a checkpoint)."""
    checkpoint_seconds: float | None
    checkpoint_every_updates: int | None
    updates_per_call: int | None
    """None for ``auto``."""
    measure_every: int | None = None
    """Every how many epochs a measurement on the host (the sharpness) is due; None for none."""

    def validates_after(self, epoch: int) -> bool:
        """Whether the run validates after ``epoch`` (0-based): every ``validate_every``-th, and the last."""
        return self.validates and ((epoch + 1) % self.validate_every == 0 or epoch + 1 == self.epochs)

    def measures_after(self, epoch: int) -> bool:
        """Whether a measurement is due after ``epoch`` (0-based): every ``measure_every``-th."""
        return self.measure_every is not None and (epoch + 1) % self.measure_every == 0

    def updates_until_host(self, epoch: int, batch: int, optimizer_steps: int) -> int:
        """How many updates from batch ``batch`` of ``epoch`` on may run before the host is needed."""
        left_in_epoch = self.batches_per_epoch - batch
        if self.every_epoch_end:
            last = epoch
        else:
            # The next epoch whose end needs the host: the next that validates or measures, or the last.
            last = self.epochs - 1
            if self.validates:
                last = min(last, _next_multiple(epoch, self.validate_every))
            if self.measure_every is not None:
                last = min(last, _next_multiple(epoch, self.measure_every))
        count = left_in_epoch + (last - epoch) * self.batches_per_epoch
        if self.checkpoint_every_updates:
            count = min(count, self.checkpoint_every_updates - optimizer_steps % self.checkpoint_every_updates)
        return count

    def wanted(self, seconds_per_update: float | None) -> int:
        """``updates_per_call``, or for ``auto`` :data:`CALL_SECONDS` of work (one, until a call has been timed)."""
        if self.updates_per_call is not None:
            return self.updates_per_call
        if seconds_per_update is None:
            return 1
        return max(1, min(int(CALL_SECONDS / max(seconds_per_update, 1e-9)), MOST_ROWS_PER_CALL))

    def call_size(self, wanted: int, until_host: int, most: int, batch_size: int) -> int:
        """``wanted``, but no more than ``until_host``, ``most`` (what one call holds) and the rows a call takes."""
        return max(1, min(wanted, until_host, most, MOST_ROWS_PER_CALL // batch_size))


def _next_multiple(epoch: int, every: int) -> int:
    """The first epoch from ``epoch`` on (0-based) whose count (1-based) ``every`` divides."""
    return math.ceil((epoch + 1) / every) * every - 1
