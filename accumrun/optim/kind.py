"""What an optimizer or schedule kind is to the rest of accumrun: its config section, its build, and for an
optimizer, what it declares it needs of the run and refuses. Code outside the registry asks these, never the
section's or the optimizer's class; the rules the declarations make are written once, in :mod:`accumrun.optim.rules`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import BaseModel

from accumrun.kinds import Precision

if TYPE_CHECKING:
    import keras  # noqa: F401 (named in OptimizerKind's base, a string ruff does not read)

SectionT = TypeVar("SectionT", bound=BaseModel)
BuiltT = TypeVar("BuiltT")


@dataclass(frozen=True)
class Registered(Generic[SectionT, BuiltT]):
    """One kind chosen by name: its section, and its build (which imports TensorFlow when it runs)."""

    name: str
    """Its tag in the config's union, and how its refusals name it."""
    section: type[SectionT]
    build: Callable[[SectionT], BuiltT]


@dataclass(frozen=True)
class OptimizerKind(Registered[SectionT, "keras.optimizers.Optimizer"]):
    """One kind of optimizer, with its declarations."""

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
