"""Optimizer and learning-rate schedule from config: any Keras optimizer or schedule, by name.

The optimizer is applied once per batch, so its step counter, and any schedule read from it, count batches
(optimizer updates), never sub-batches.
"""

from __future__ import annotations

import keras

from accumrun.config.schema import LbfgsConfig, OptimizerConfig, ScheduleConfig
from accumrun.core.lbfgs import Lbfgs
from accumrun.errors import ConfigError
from accumrun.lookup import checked_keywords, classes_in, find

# Keras' own accumulation would accumulate again across our batches and break the one-update-per-batch rule.
_REFUSED_KEYWORDS = {
    "gradient_accumulation_steps": "accumrun accumulates itself; use training.subdivisions",
}
# Keras skips clipping silently unless these are positive.
_POSITIVE_KEYWORDS = ("clipnorm", "global_clipnorm", "clipvalue")
# Wrappers that need another optimizer as an argument cannot be built from a name alone.
_NOT_BY_NAME = ("LossScaleOptimizer", "MultiOptimizer", "OptimizerMap")


def build_optimizer(config: OptimizerConfig | LbfgsConfig) -> keras.optimizers.Optimizer:
    """Build the configured optimizer (L-BFGS, or a Keras optimizer whose keywords are checked against the class's
    signature).

    Raises:
        ConfigError: unknown optimizer or schedule, or a keyword it does not take, or a value it rejects.
    """
    if isinstance(config, LbfgsConfig):
        return Lbfgs(
            history=config.history,
            tolerance_grad=config.tolerance_grad,
            tolerance_change=config.tolerance_change,
            max_evaluations=config.max_evaluations,
            learning_rate=config.learning_rate,
        )
    classes = classes_in(keras.optimizers, keras.optimizers.Optimizer, exclude=_NOT_BY_NAME)
    optimizer_class = find(classes, config.name, "optimizer.name", "optimizer")
    keywords = config.keywords
    for key, reason in _REFUSED_KEYWORDS.items():
        if key in keywords:
            raise ConfigError(f"optimizer.{key}", reason, keywords[key])
    keywords = checked_keywords(
        optimizer_class, keywords, "optimizer", optimizer_class.__name__, positive=_POSITIVE_KEYWORDS
    )
    learning_rate = config.learning_rate
    if isinstance(learning_rate, ScheduleConfig):
        learning_rate = build_schedule(learning_rate)
    try:
        return optimizer_class(learning_rate=learning_rate, **keywords)
    except (TypeError, ValueError) as error:
        raise ConfigError("optimizer", f"{optimizer_class.__name__} rejected the settings: {error}") from None


def build_schedule(config: ScheduleConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    """Build a Keras learning-rate schedule; its step counts optimizer updates (= batches)."""
    classes = classes_in(keras.optimizers.schedules, keras.optimizers.schedules.LearningRateSchedule)
    schedule_class = find(classes, config.name, "optimizer.learning_rate.name", "schedule")
    keywords = dict(config.model_extra or {})
    keywords = checked_keywords(schedule_class, keywords, "optimizer.learning_rate", schedule_class.__name__)
    try:
        return schedule_class(**keywords)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            "optimizer.learning_rate", f"{schedule_class.__name__} rejected the settings: {error}"
        ) from None
