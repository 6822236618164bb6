"""Any Keras optimizer by name (``optimizer.name: adam``, ``AdamW``, ``sgd``, ...): its section and its build.

The optimizer is applied once per batch, so its step counter, and any schedule read from it, count batches
(optimizer updates), never sub-batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import field_validator

from accumrun.data.section import Keywords
from accumrun.errors import ConfigError
from accumrun.lookup import checked_keywords, classes_in, find
from accumrun.optim.kind import OptimizerKind
from accumrun.optim.schedules import LearningRate, ScheduleConfig, build_schedule
from accumrun.optim.section import ReduceOnPlateauConfig

if TYPE_CHECKING:
    import keras

# Keras' own accumulation would accumulate again across our batches and break the one-update-per-batch rule.
_REFUSED_KEYWORDS = {
    "gradient_accumulation_steps": "accumrun accumulates itself; use training.subdivisions",
}
# Keras skips clipping silently unless these are positive.
_POSITIVE_KEYWORDS = ("clipnorm", "global_clipnorm", "clipvalue")
# Wrappers that need another optimizer as an argument cannot be built from a name alone.
_NOT_BY_NAME = ("LossScaleOptimizer", "MultiOptimizer", "OptimizerMap")


class OptimizerConfig(Keywords):
    """A Keras optimizer by name; other keys are its keyword arguments, checked when it is built."""

    name: str = "adam"
    learning_rate: LearningRate = 0.001
    reduce_on_plateau: ReduceOnPlateauConfig | None = None

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _positive_or_schedule(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError("must be a positive number or a schedule mapping with a 'name'")
        return float(value)

    @property
    def kind(self) -> OptimizerKind[OptimizerConfig]:
        """The registered kind: Keras' optimizers by name."""
        return KERAS_OPTIMIZER

    @property
    def schedule(self) -> ScheduleConfig | None:
        """The learning-rate schedule, or None for a fixed rate."""
        return None if isinstance(self.learning_rate, float) else self.learning_rate

    def describe(self, epochs: str, seed: int) -> str:
        """``optimizer adam, learning rate 0.001, 10 epochs, seed 0``."""
        schedule = self.schedule
        rate = f"{self.learning_rate:g}" if schedule is None else f"schedule {schedule.name}"
        return f"optimizer {self.name}, learning rate {rate}, {epochs}, seed {seed}"


def build_keras_optimizer(config: OptimizerConfig) -> keras.optimizers.Optimizer:
    """Build a Keras optimizer, its keywords checked against the class's signature.

    Raises:
        ConfigError: unknown optimizer or schedule, or a keyword it does not take, or a value it rejects.
    """
    import keras

    classes = classes_in(keras.optimizers, keras.optimizers.Optimizer, exclude=_NOT_BY_NAME)
    # lbfgs is among the names an unknown one is offered (the union sends its spellings to its own kind).
    optimizer_class = find({**classes, "lbfgs": "lbfgs"}, config.name, "optimizer.name", "optimizer")
    keywords = checked_keywords(
        optimizer_class,
        config.keywords,
        "optimizer",
        optimizer_class.__name__,
        positive=_POSITIVE_KEYWORDS,
        refused=_REFUSED_KEYWORDS,
    )
    schedule = config.schedule
    learning_rate = config.learning_rate if schedule is None else build_schedule(schedule)
    try:
        return optimizer_class(learning_rate=learning_rate, **keywords)
    except (TypeError, ValueError) as error:
        raise ConfigError("optimizer", f"{optimizer_class.__name__} rejected the settings: {error}") from None


KERAS_OPTIMIZER = OptimizerKind("keras", OptimizerConfig, build_keras_optimizer)
"""Every Keras optimizer, by name: minibatch steps, any precision, any schedule."""
