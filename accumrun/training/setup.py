"""Everything a run trains, built from a config: the data, the batch size, the model, the optimizer, the loss
and metrics, and the steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from accumrun.config.schema import Config, TrainingConfig
from accumrun.core.losses import MetricSet
from accumrun.core.step import Step, make_eval_step, make_train_step
from accumrun.data.dataset import Dataset, epoch_order, load_dataset
from accumrun.errors import ConfigError
from accumrun.models.builders import build_model
from accumrun.objective import FittedObjective, fit_objective
from accumrun.optim import build_optimizer
from accumrun.training.distribute import strategy_scope


def resolve_batch_size(training: TrainingConfig, train_size: int) -> int:
    """The batch size in samples: ``full`` is the whole training set.

    Raises:
        ConfigError: the batch is larger than the training set, or has fewer samples than subdivisions.
    """
    batch_size = train_size if training.batch_size == "full" else training.batch_size
    if batch_size > train_size:
        raise ConfigError(
            "training.batch_size",
            f"is larger than the {train_size:,} training samples; use batch_size: full for full-batch training",
            training.batch_size,
        )
    subdivisions = training.fixed_subdivisions
    if subdivisions is not None and subdivisions > batch_size:
        raise ConfigError(
            "training.subdivisions", f"cannot exceed the batch size ({batch_size:,} samples)", subdivisions
        )
    return batch_size


@dataclass
class TrainingSetup:
    """What a run trains: the data, the batch size, the model, optimizer, loss and metrics, and the steps that
    train them. ``config`` is resolved: the task, loss and metrics it left to accumrun are filled in."""

    config: Config
    dataset: Dataset
    batch_size: int
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    objective: FittedObjective
    strategy: tf.distribute.Strategy | None
    train_metrics: MetricSet = field(init=False)
    val_metrics: MetricSet = field(init=False)

    def __post_init__(self) -> None:
        with strategy_scope(self.strategy):
            self.train_metrics = self.objective.objective.new_metrics()
            self.val_metrics = self.objective.objective.new_metrics()

    @property
    def replicas(self) -> int:
        """How many replicas share each batch (1 without a strategy)."""
        return self.strategy.num_replicas_in_sync if self.strategy is not None else 1

    def make_step(self, subdivisions: int) -> Step:
        """Compile the train step for ``subdivisions`` (see :func:`accumrun.core.step.make_train_step`)."""
        with strategy_scope(self.strategy):
            return make_train_step(
                self.model,
                self.objective.objective,
                self.optimizer,
                subdivisions,
                metrics=self.train_metrics,
                strategy=self.strategy,
                jit_compile=self.config.training.jit_compile,
            )

    def make_eval_step(self) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
        """Compile the evaluation step (inference mode), which adds to ``val_metrics``."""
        return make_eval_step(self.model, self.objective.objective, self.val_metrics)

    def first_batch(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The first batch of the first epoch, as the run will see it."""
        config, dataset = self.config, self.dataset
        index = epoch_order(dataset.train_size, config.seed, 0, config.data.shuffle)[: self.batch_size]
        return tf.constant(dataset.x_train[index]), tf.constant(dataset.y_train[index])


def build_training(config: Config, strategy: tf.distribute.Strategy | None = None) -> TrainingSetup:
    """Load the data, build the model (under ``training.precision``), its loss and metrics, and the optimizer,
    from the seed.

    With a ``strategy``, the variables are made in its scope, to live on every replica, and the steps are
    replicated ones.

    Raises:
        ConfigError: the model, loss, metrics, optimizer or sizes do not fit the config or the data.
        DataError: the data cannot be loaded or does not fit the model.
    """
    dataset = load_dataset(config.data, config.seed)
    batch_size = resolve_batch_size(config.training, dataset.train_size)
    keras.utils.set_random_seed(config.seed)
    precision = config.training.precision
    previous_policy = keras.mixed_precision.dtype_policy()
    with strategy_scope(strategy):
        # The policy is global in Keras; layers keep the one they were built with, so restore it at once.
        keras.mixed_precision.set_dtype_policy(precision)
        try:
            model = build_model(config.model, dataset.sample_shape, dataset.outputs)
        finally:
            keras.mixed_precision.set_dtype_policy(previous_policy)
        objective = fit_objective(config, dataset, model)
        optimizer = build_optimizer(config.optimizer)
        if precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        # Built now, so its state exists before the first step (checkpoints and auto's tries restore it).
        optimizer.build(model.trainable_variables)
    resolved = config.model_copy(
        update={
            "data": config.data.model_copy(update={"task": dataset.task}),
            "loss": objective.loss,
            "metrics": objective.metrics,
        }
    )
    return TrainingSetup(resolved, dataset, batch_size, model, optimizer, objective, strategy)
