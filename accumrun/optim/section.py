"""What every ``optimizer`` section offers the code outside the registry, whatever its kind, and the one key they
share, ``reduce_on_plateau``."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field

from accumrun.optim.kind import OptimizerKind
from accumrun.optim.schedules import ScheduleConfig
from accumrun.sections import Watched


class OptimizerSection(Protocol):
    """The ``optimizer`` section as code outside the registry reads it."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> OptimizerKind[Any]:
        """The registered kind: its build and its declarations."""

    @property
    def reduce_on_plateau(self) -> ReduceOnPlateauConfig | None: ...

    @property
    def schedule(self) -> ScheduleConfig | None:
        """The learning-rate schedule, or None for a fixed rate."""

    def describe(self, epochs: str, seed: int) -> str:
        """The startup line: ``optimizer adam, learning rate 0.001, 10 epochs, seed 0``."""


class ReduceOnPlateauConfig(Watched):
    """Multiply the learning rate by ``factor`` when ``monitor`` has not improved by more than ``min_delta`` for
    ``patience`` epochs, then wait ``cooldown`` epochs; never below ``min_lr``. It applies from the next epoch."""

    factor: float = Field(0.5, gt=0, lt=1)
    patience: int = Field(3, ge=1)
    min_delta: float = Field(0.0, ge=0)
    cooldown: int = Field(0, ge=0)
    min_lr: float = Field(0.0, ge=0)
