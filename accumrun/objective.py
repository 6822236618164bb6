"""The loss and metrics from the config, fitted to the task and to what the model outputs.

Unset, they follow the task: sparse categorical cross-entropy and accuracy for class labels, binary cross-entropy
and accuracy for a binary task (one output unit), binary cross-entropy and binary accuracy for multi-label
targets; regression needs a loss named, and is measured by the mean absolute error. ``from_logits`` follows the
model: a softmax or sigmoid at its end means probabilities.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from accumrun.config.schema import Config, LossConfig, MetricEntry
from accumrun.core.evaluation import make_eval_step
from accumrun.core.losses import LossFn, Metric, MetricSet, Objective, Perplexity
from accumrun.data.dataset import Dataset
from accumrun.data.feeder import Feeder
from accumrun.errors import ConfigError
from accumrun.kinds import Precision, Task
from accumrun.lookup import checked_keywords, classes_in, find, import_function, normalized
from accumrun.models.outputs import check_output_shape, output_activation

DEFAULT_LOSS = {
    Task.CLASSIFICATION: "sparse_categorical_crossentropy",
    Task.BINARY: "binary_crossentropy",
    Task.MULTI_LABEL: "binary_crossentropy",
    Task.CAUSAL_LM: "sparse_categorical_crossentropy",
}
DEFAULT_METRICS: dict[Task, list[MetricEntry]] = {
    Task.CLASSIFICATION: ["accuracy"],
    Task.BINARY: ["accuracy"],
    Task.MULTI_LABEL: ["binary_accuracy"],
    Task.REGRESSION: ["mean_absolute_error"],
    Task.CAUSAL_LM: ["accuracy", "perplexity"],
}
_ACCURACY = ("accuracy", "acc")
# accumrun's own metrics, by normalized name, besides every keras.metrics class.
_OWN_METRICS: dict[str, type] = {"perplexity": Perplexity}
# The tasks whose targets are class indices with one output per class, as sparse losses and metrics take them.
_SPARSE_TASKS = (Task.CLASSIFICATION, Task.CAUSAL_LM)
# Base classes and wrappers that cannot be built from a name alone.
_NOT_LOSSES = ("LossFunctionWrapper",)
_NOT_METRICS = ("Mean", "Sum", "MeanMetricWrapper", "Reduce")


@dataclass(frozen=True)
class FittedObjective:
    """The objective for the step, and what was decided, to record in ``config.yaml`` and print."""

    objective: Objective
    loss: LossConfig
    """The loss as resolved: its name, and ``from_logits`` where the loss takes it."""
    metrics: list[MetricEntry]
    activation: str | None
    """``softmax`` or ``sigmoid`` when the model outputs probabilities, else None."""

    @property
    def metric_names(self) -> list[str]:
        """The metrics' logged names, in order (a repeated name gets ``_2``)."""
        return [metric.name for metric in self.objective.metrics]

    def describe(self) -> list[str]:
        """The startup lines: the loss, logits or probabilities, and the metrics."""
        logits = f", from_logits={self.loss.from_logits}" if self.loss.from_logits is not None else ""
        names = ", ".join(self.metric_names) or "none"
        lines = [f"loss {self.loss.name}{logits}; metrics {names}"]
        if self.activation is not None:
            lines.append(
                f"model outputs probabilities ({self.activation}): loss uses from_logits={self.loss.from_logits}"
            )
        return lines


class Scorer:
    """The one validation pass: the mean loss per sample (or real token) and every metric of ``objective`` over a
    feeder's samples, in inference mode. Training scores its validation data with it after each epoch, and ``evaluate``
    a finished run's model, so both give the same figures."""

    def __init__(self, model: keras.Model, objective: Objective, metrics: MetricSet) -> None:
        self._metrics = metrics
        self._step = make_eval_step(model, objective, metrics)

    def __call__(self, feeder: Feeder) -> dict[str, float]:
        """``loss`` and each metric under its logged name, over the samples of ``feeder``'s epoch."""
        self._metrics.reset()
        loss_sum = units = 0.0
        for x, y in feeder.epoch(0):
            batch_loss, batch_units = self._step(x, y)
            loss_sum += float(batch_loss)
            units += float(batch_units)
        return {"loss": loss_sum / units, **self._metrics.results()}


def fit_objective(
    config: Config, dataset: Dataset, model: keras.Model, sample: tuple[tf.Tensor, tf.Tensor]
) -> FittedObjective:
    """Build the loss and metrics for ``dataset``'s task and ``model``'s output, checking that they fit;
    ``sample`` is a few training samples and targets, as the model takes them.

    Raises:
        ConfigError: an unknown loss or metric (the closest name is suggested), a keyword it does not take, a
            loss that needs class labels for other targets, regression without a loss, a model output that
            cannot hold the targets, or a custom loss that does not return one value per sample.
    """
    task = dataset.task
    name = config.loss.name or DEFAULT_LOSS.get(task)
    if name is None:
        raise ConfigError(
            "loss.name",
            f"{dataset.describe_targets()} need a loss; set loss: {{name: mean_squared_error}} (or "
            "mean_absolute_error, huber, ...)",
        )
    activation = output_activation(model)
    if ":" in name:
        loss_fn, sparse, from_logits = _custom_loss(config.loss, name)
    else:
        loss_fn, sparse, from_logits = _keras_loss(config.loss, name, task, activation)
    width = check_output_shape(model, task, dataset.target_shape, dataset.classes, sparse)
    entries = config.metrics if config.metrics is not None else DEFAULT_METRICS[task]
    metrics = _metrics(entries, task, width)
    objective = Objective(
        loss=loss_fn,
        class_labels=task.class_labels,
        sparse_loss=sparse,
        outputs=width,
        to_probabilities=probability_function(task, width, from_logits, activation),
        metrics=tuple(metrics),
        token_level=task.token_level,
        # Mixed-precision outputs are cast up to float32; float64 keeps every sum in float64.
        dtype=tf.float64 if config.training.precision is Precision.FLOAT64 else tf.float32,
    )
    _check_per_sample(objective, model, sample, name)
    resolved = LossConfig.model_validate({**config.loss.keywords, "name": name, "from_logits": from_logits})
    return FittedObjective(objective, resolved, list(entries), activation)


def _keras_loss(config: LossConfig, name: str, task: Task, activation: str | None) -> tuple[LossFn, bool, bool | None]:
    """A ``keras.losses`` class by name, built to return one value per sample; whether it takes class indices
    as they are, and the ``from_logits`` it was given (None when it takes none)."""
    losses = classes_in(keras.losses, keras.losses.Loss, exclude=_NOT_LOSSES)
    loss_class = _with_alias(losses, name, keras.losses.get) or find(losses, name, "loss.name", "loss")
    keywords = config.keywords
    keywords = checked_keywords(loss_class, keywords, "loss", loss_class.__name__)
    takes_logits = "from_logits" in _parameters(loss_class)
    if config.from_logits is not None and not takes_logits:
        raise ConfigError("loss.from_logits", f"{loss_class.__name__} has no such argument", config.from_logits)
    from_logits = None
    if takes_logits:
        from_logits = config.from_logits if config.from_logits is not None else activation is None
        keywords["from_logits"] = from_logits
    sparse = loss_class.__name__.startswith("Sparse")
    _refuse_per_class(loss_class, task, "loss.name", name)
    if sparse and task not in _SPARSE_TASKS:
        raise ConfigError(
            "loss.name",
            f"{name} takes integer class labels, but the targets are {task.value.replace('_', '-')} values; "
            f"use {'binary_crossentropy' if task is Task.MULTI_LABEL else 'mean_squared_error'}",
            name,
        )
    try:
        # reduction=None: one value per sample, which the step weights by sub-batch exactly.
        return loss_class(reduction=None, **keywords), sparse, from_logits
    except (TypeError, ValueError) as error:
        raise ConfigError("loss", f"{loss_class.__name__} rejected the settings: {error}") from None


def _custom_loss(config: LossConfig, name: str) -> tuple[LossFn, bool, bool | None]:
    """``package.module:function(targets, predictions)`` with the configured keywords; class labels reach it
    as indices."""
    function = import_function(name, "loss.name")
    keywords = config.keywords
    if config.from_logits is not None:
        keywords["from_logits"] = config.from_logits
    keywords = checked_keywords(function, keywords, "loss", name)
    return functools.partial(function, **keywords), True, config.from_logits


def _metrics(entries: list[MetricEntry], task: Task, width: int) -> list[Metric]:
    metrics_by_name = classes_in(keras.metrics, keras.metrics.Metric, exclude=_NOT_METRICS)
    built: list[Metric] = []
    taken: dict[str, int] = {}
    for index, entry in enumerate(entries):
        path = f"metrics[{index}]"
        # A metric written as a name is refused at its place in the list; one written as a section, at its name.
        name, keywords, where = (
            (entry, {}, path) if isinstance(entry, str) else (entry.name, entry.keywords, f"{path}.name")
        )
        if normalized(name) in _ACCURACY:
            if task is Task.REGRESSION:
                raise ConfigError(path, "accuracy needs class labels; for regression use mean_absolute_error", name)
            metric_class: type = (
                keras.metrics.SparseCategoricalAccuracy
                if task in _SPARSE_TASKS and width > 1
                else keras.metrics.BinaryAccuracy
            )
        elif normalized(name) in _OWN_METRICS:
            metric_class = _OWN_METRICS[normalized(name)]
            if task not in _SPARSE_TASKS:
                raise ConfigError(path, f"{name} needs class labels or next tokens, one output per class", name)
        else:
            metric_class = _with_alias(metrics_by_name, name, keras.metrics.get) or find(
                metrics_by_name, name, where, "metric"
            )
        sparse = metric_class.__name__.startswith("Sparse") or metric_class is Perplexity
        _refuse_per_class(metric_class, task, path, name)
        if sparse and task not in _SPARSE_TASKS:
            raise ConfigError(
                path, f"{name} takes integer class labels; the targets are {task.value.replace('_', '-')}"
            )
        keywords = checked_keywords(metric_class, keywords, path, metric_class.__name__)
        taken[name] = taken.get(name, 0) + 1
        logged = name if taken[name] == 1 else f"{name}_{taken[name]}"
        make = functools.partial(metric_class, name=logged, **keywords)
        try:
            make()
        except (TypeError, ValueError) as error:
            raise ConfigError(path, f"{metric_class.__name__} rejected the settings: {error}") from None
        built.append(Metric(logged, make, sparse))
    return built


def _refuse_per_class(cls: type, task: Task, path: str, name: str) -> None:
    """A loss or metric over one output per class (categorical, top-k) would see a binary task's one unit as a
    single certain class: refuse it, naming the binary one."""
    if task is Task.BINARY and ("Categorical" in cls.__name__ or "TopK" in cls.__name__):
        binary = "binary_crossentropy" if path == "loss.name" else "accuracy"
        raise ConfigError(path, f"{name} needs one output per class; a binary task has one: use {binary}", name)


def _with_alias(classes: dict[str, type], name: str, get: Callable[[str], Any]) -> type | None:
    """The class that a Keras alias names (``mse``, ``mae``, ``kld``): Keras resolves it to an instance of the
    class (metrics), or to a function named as the class is (losses)."""
    if normalized(name) in classes:
        return classes[normalized(name)]
    try:
        resolved = get(name)
    except (ValueError, TypeError):
        return None
    if type(resolved) in classes.values():
        return type(resolved)
    return classes.get(normalized(getattr(resolved, "__name__", "")))


def _parameters(cls: type) -> set[str]:
    return set(inspect.signature(cls).parameters)


def probability_function(
    task: Task, width: int, from_logits: bool | None, activation: str | None
) -> Callable[[tf.Tensor], tf.Tensor]:
    """What turns the model's outputs into what metrics and predictions see: probabilities, whatever the model
    outputs. ``from_logits`` is the loss's (None when it takes none: then the model's last ``activation`` says)."""
    already = (not from_logits) if from_logits is not None else activation is not None
    if already or task is Task.REGRESSION:
        return tf.identity
    if task is Task.MULTI_LABEL or width == 1:
        return tf.sigmoid
    return tf.nn.softmax


def _check_per_sample(objective: Objective, model: keras.Model, sample: tuple[tf.Tensor, tf.Tensor], name: str) -> None:
    """Refuse a loss that returns one value for a whole sub-batch: sub-batches could not be weighted."""
    x, y = sample
    samples = int(x.shape[0])
    values = objective.loss_values(y, model(x, training=False))
    shape = tuple(values.shape)
    if not shape or shape[0] != samples:
        raise ConfigError(
            "loss.name",
            f"{name} returned shape {shape} for {samples} samples; accumrun needs one value per sample (shape "
            f"[{samples}]) to weight uneven sub-batches exactly: return the per-sample values, not their mean",
            name,
        )
