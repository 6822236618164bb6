"""The ``loss`` and ``metrics`` sections: what the objective (:mod:`accumrun.objective`) builds."""

from __future__ import annotations

from accumrun.data.section import Keywords
from accumrun.sections import Flag


class LossConfig(Keywords):
    """A ``keras.losses`` loss by snake_case or class name, or ``package.module:function`` returning one value per
    sample; other keys are its keywords. Unset, it follows the task (regression needs one named)."""

    name: str | None = None
    from_logits: Flag | None = None
    """Unset, it is read from the model: False when its output layer is a softmax or sigmoid."""


class MetricConfig(Keywords):
    """A ``keras.metrics`` metric by name, with its keyword arguments: ``{name: top_k_categorical_accuracy, k: 5}``."""

    name: str


MetricEntry = str | MetricConfig
