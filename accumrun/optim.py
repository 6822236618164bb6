"""Optimizer and learning-rate schedule from config: any Keras optimizer or schedule, by name.

The optimizer is applied once per batch, so its step counter, and any schedule read from it, count batches
(optimizer updates), never sub-batches.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import keras

from accumrun.config.schema import OptimizerConfig, ScheduleConfig
from accumrun.errors import ConfigError

# Keras' own accumulation would accumulate again across our batches and break the one-update-per-batch rule.
_REFUSED_KEYWORDS = {
    "gradient_accumulation_steps": "accumrun accumulates itself; use training.subdivisions",
}
# Keras skips clipping silently unless these are positive.
_POSITIVE_KEYWORDS = ("clipnorm", "global_clipnorm", "clipvalue")
# Wrappers that need another optimizer as an argument cannot be built from a name alone.
_NOT_BY_NAME = {"Optimizer", "LossScaleOptimizer", "MultiOptimizer", "OptimizerMap"}


def build_optimizer(config: OptimizerConfig) -> keras.optimizers.Optimizer:
    """Build the configured optimizer; its keywords are checked against the class's signature.

    Raises:
        ConfigError: unknown optimizer or schedule, or a keyword it does not take, or a value it rejects.
    """
    optimizer_class = _find_class(_optimizer_classes(), config.name, "optimizer.name", "optimizer")
    keywords = config.keywords
    for key, reason in _REFUSED_KEYWORDS.items():
        if key in keywords:
            raise ConfigError(f"optimizer.{key}", reason, keywords[key])
    _check_keywords(optimizer_class, keywords, "optimizer")
    learning_rate = config.learning_rate
    if isinstance(learning_rate, ScheduleConfig):
        learning_rate = build_schedule(learning_rate)
    try:
        return optimizer_class(learning_rate=learning_rate, **keywords)
    except (TypeError, ValueError) as error:
        raise ConfigError("optimizer", f"{optimizer_class.__name__} rejected the settings: {error}") from None


def build_schedule(config: ScheduleConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    """Build a Keras learning-rate schedule; its step counts optimizer updates (= batches)."""
    schedule_class = _find_class(_schedule_classes(), config.name, "optimizer.learning_rate.name", "schedule")
    keywords = dict(config.model_extra or {})
    _check_keywords(schedule_class, keywords, "optimizer.learning_rate")
    try:
        return schedule_class(**keywords)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            "optimizer.learning_rate", f"{schedule_class.__name__} rejected the settings: {error}"
        ) from None


def _normalized(name: str) -> str:
    """``AdamW``, ``adam_w`` and ``adamw`` all name the same class."""
    return name.replace("_", "").lower()


def _optimizer_classes() -> dict[str, type]:
    return {
        _normalized(name): cls
        for name, cls in vars(keras.optimizers).items()
        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer) and name not in _NOT_BY_NAME
    }


def _schedule_classes() -> dict[str, type]:
    base = keras.optimizers.schedules.LearningRateSchedule
    return {
        _normalized(name): cls
        for name, cls in vars(keras.optimizers.schedules).items()
        if isinstance(cls, type) and issubclass(cls, base) and cls is not base
    }


def _find_class(classes: dict[str, type], name: str, path: str, kind: str) -> type:
    found = classes.get(_normalized(name))
    if found is not None:
        return found
    names = sorted(cls.__name__ for cls in classes.values())
    # A transposition ("adma") should suggest the anagram, which difflib may rank below a longer name.
    anagrams = [key for key in classes if sorted(key) == sorted(_normalized(name))]
    close = anagrams or difflib.get_close_matches(_normalized(name), list(classes), n=1)
    hint = f"did you mean '{classes[close[0]].__name__}'?" if close else f"known: {', '.join(names)}"
    raise ConfigError(path, f"unknown {kind}; {hint}", name)


def _check_keywords(cls: type[object], keywords: dict[str, Any], path: str) -> None:
    parameters = inspect.signature(cls.__init__).parameters
    accepted = [name for name, p in parameters.items() if name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD]
    for key, value in keywords.items():
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"it takes: {', '.join(accepted)}"
            raise ConfigError(f"{path}.{key}", f"{cls.__name__} has no such argument; {hint}", value)
        default = parameters[key].default
        # Keras keeps a wrong-typed number as given, and it fails only later, inside the compiled step.
        numeric_default = isinstance(default, int | float) and not isinstance(default, bool)
        if numeric_default and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{path}.{key}", "must be a number", value)
        if key in _POSITIVE_KEYWORDS and value is not None and value <= 0:
            raise ConfigError(f"{path}.{key}", "must be > 0 (Keras ignores it otherwise)", value)
