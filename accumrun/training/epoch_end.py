"""What an epoch that ends a call computes before its row, as hooks: precise BatchNorm statistics (first, so that
validation and the epoch's checkpoint hold them), then validation."""

from __future__ import annotations

from collections.abc import Callable

from accumrun.training.cadence import Cadence
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import Hook


class PreciseStatistics(Hook):
    """Recomputes the BatchNorm moving statistics (``recompute``) at each epoch's end (each ends its call)."""

    def __init__(self, recompute: Callable[[], None]) -> None:
        self._recompute = recompute

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        if ends_call:
            self._recompute()
        return {}


class Validation(Hook):
    """Adds ``val_loss`` and ``val_<metric>`` (``validate``) to the row of each epoch that validates."""

    def __init__(self, validate: Callable[[], dict[str, float]], cadence: Cadence) -> None:
        self._validate = validate
        self._cadence = cadence

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        if ends_call and self._cadence.validates_after(position.epoch):
            return self._validate()
        return {}
