"""The ``output`` section: where a run's folder is, what it logs and how often it writes checkpoints, and which
model it keeps as the best (:mod:`accumrun.rundir` writes the files)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from accumrun.sections import Flag, Section, Watched


def duration_seconds(text: str) -> float:
    """``90s``, ``10min``, ``1.5h`` in seconds.

    Raises:
        ValueError: not a positive number followed by ``s``, ``min`` or ``h``.
    """
    for unit, seconds in {"s": 1, "min": 60, "h": 3600}.items():
        number = text.strip().removesuffix(unit)
        if number != text.strip():
            try:
                value = float(number)
            except ValueError:
                break
            if value > 0:
                return value * seconds
    raise ValueError("must be a duration such as 90s, 10min or 1h, or null for the ends of epochs only")


class KeepBestConfig(Watched):
    """Keep ``model.best.keras`` from the epoch with the best ``monitor``."""


class OutputConfig(Section):
    run_dir: str = "runs/{config_name}-{timestamp}"
    tensorboard: Flag = True
    log_every_updates: int | None = Field(None, ge=1)
    checkpoint_every: str | None = "10min"
    """How often a checkpoint is written (None: at each epoch's end); also at every stop, signal and the run's end."""
    checkpoint_every_updates: int | None = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    keep_best: str | KeepBestConfig | None = None
    """A logged figure (``val_loss``) or ``{monitor, mode}``: keep ``model.best.keras`` from its best epoch."""

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            duration_seconds(value if isinstance(value, str) else "")
        return value

    @property
    def checkpoint_seconds(self) -> float | None:
        """``checkpoint_every`` in seconds; None for the end of every epoch."""
        return None if self.checkpoint_every is None else duration_seconds(self.checkpoint_every)

    @property
    def best(self) -> KeepBestConfig | None:
        """``keep_best`` as a monitor and mode."""
        return KeepBestConfig(monitor=self.keep_best) if isinstance(self.keep_best, str) else self.keep_best
