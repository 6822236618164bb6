"""What an optimizer kind is to the rest of accumrun: its config section, its build, and what it declares it needs
of the run and refuses. Code outside the registry asks these, never the section's or the optimizer's class; the
rules the declarations make are written once, in :mod:`accumrun.optim.rules`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, Field

from accumrun.kinds import Precision
from accumrun.sections import Watched

if TYPE_CHECKING:
    import keras

    from accumrun.optim.schedules import ScheduleConfig

SectionT = TypeVar("SectionT", bound=BaseModel)


@dataclass(frozen=True)
class OptimizerKind(Generic[SectionT]):
    """One kind of optimizer: its section, its build (which imports TensorFlow when it runs), and its declarations."""

    name: str
    """Its tag in the config's ``optimizer`` union, and how its refusals name it."""
    section: type[SectionT]
    build: Callable[[SectionT], keras.optimizers.Optimizer]
    full_batch: bool = False
    """It takes full-batch steps on the exact gradient: it needs ``training.batch_size: full``, and the noise scale
    (which measures minibatch steps) has nothing to measure."""
    same_objective: bool = False
    """It needs the same objective at the same weights: no augmentation, BatchNorm frozen (checked once the model is
    built), and the random layers off (the step's inference mode)."""
    iterates: bool = False
    """One update is an iteration that the optimizer drives through several full-batch evaluations of the step
    (its ``iterate``), one iteration per epoch."""
    precisions: tuple[Precision, ...] = tuple(Precision)
    """The ``training.precision`` values it takes."""
    precision_reason: str = ""
    """Why it takes no others."""


class OptimizerSection(Protocol):
    """What code outside the registry reads of the ``optimizer`` section, whatever its kind."""

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
