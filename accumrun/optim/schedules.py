"""Learning-rate schedules, registered once: ``optimizer.learning_rate`` is a number, or a schedule whose step
counts optimizer updates (batches), never sub-batches.

One kind today, any Keras schedule by name; the table :data:`SCHEDULES` holds it as :data:`accumrun.optim.optimizers.
OPTIMIZERS` holds the optimizers. A second kind would be chosen by ``name`` in the ``schedule`` branch of
:data:`LearningRate`, as the optimizers' union chooses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Discriminator, Tag

from accumrun.data.section import Keywords
from accumrun.errors import ConfigError
from accumrun.lookup import checked_keywords, classes_in, find
from accumrun.optim.kind import Registered

if TYPE_CHECKING:
    import keras

    ScheduleKind = Registered[Any, keras.optimizers.schedules.LearningRateSchedule]


class ScheduleConfig(Keywords):
    """A Keras learning-rate schedule by name; other keys are its keyword arguments."""

    name: str

    @property
    def kind(self) -> ScheduleKind:
        """The registered kind: Keras' schedules by name."""
        return KERAS_SCHEDULE


def build_keras_schedule(config: ScheduleConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    """Build a Keras learning-rate schedule, its keywords checked against the class's signature.

    Raises:
        ConfigError: unknown schedule, or a keyword it does not take, or a value it rejects.
    """
    import keras

    classes = classes_in(keras.optimizers.schedules, keras.optimizers.schedules.LearningRateSchedule)
    schedule_class = find(classes, config.name, "optimizer.learning_rate.name", "schedule")
    keywords = checked_keywords(schedule_class, config.keywords, "optimizer.learning_rate", schedule_class.__name__)
    try:
        return schedule_class(**keywords)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            "optimizer.learning_rate", f"{schedule_class.__name__} rejected the settings: {error}"
        ) from None


KERAS_SCHEDULE: ScheduleKind = Registered("keras", ScheduleConfig, build_keras_schedule)

SCHEDULES: dict[str, ScheduleKind] = {KERAS_SCHEDULE.name: KERAS_SCHEDULE}
"""Every kind of learning-rate schedule."""


def build_schedule(config: ScheduleConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    """Build the configured schedule; its step counts optimizer updates (= batches)."""
    return config.kind.build(config)


def _rate_kind(value: Any) -> str:
    # The field's own check has already refused anything but a number or a mapping.
    return "rate" if isinstance(value, int | float) else "schedule"


LearningRate = Annotated[
    Annotated[float, Tag("rate")] | Annotated[ScheduleConfig, Tag("schedule")],
    Discriminator(_rate_kind),
]
"""``optimizer.learning_rate``: a number, or a schedule mapping with a ``name``."""
