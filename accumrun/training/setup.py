"""Everything a run trains, built from a config into one frozen :class:`TrainingSetup` of three frozen parts: what
is trained (:class:`Trained`: the model, the optimizer, the loss and metrics), what is fed (:class:`Fed`: the data,
its batches and feed) and how it is stepped (:class:`Stepped`: the step's options), with every ``auto`` but
``subdivisions`` settled (:func:`accumrun.training.autosub.settle_subdivisions` settles that into a new setup)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import keras
import numpy as np
import tensorflow as tf

from accumrun.config.measures import one_device_refusals
from accumrun.config.remat import settle_remat
from accumrun.config.schema import Config, TrainingConfig
from accumrun.core.batch_norm import BatchNormStatistics, batch_norm_layers
from accumrun.core.losses import MetricSet, Objective
from accumrun.core.seeds import LayerDraws
from accumrun.core.step import StepSpec, TrainStep, make_train_step
from accumrun.core.sub_batches import batch_sizes, sub_batch_sizes
from accumrun.data.augment import Augmentation
from accumrun.data.dataset import Dataset, load_dataset, sample_floats, with_class_weights
from accumrun.data.feeder import Feeder, gathers
from accumrun.data.resident import resides
from accumrun.data.vocabulary import settle_vocabulary
from accumrun.errors import ConfigError
from accumrun.kinds import Feed, Precision, Task
from accumrun.models.builders import build_model
from accumrun.models.floats import check_float64, floats
from accumrun.models.preprocessing import (
    Preprocess,
    at_stored_size,
    with_input_preprocessing,
)
from accumrun.models.registry import kind_of
from accumrun.models.remat import apply_remat
from accumrun.objective import FittedObjective, fit_objective
from accumrun.optim import build_optimizer
from accumrun.optim.rules import model_problem
from accumrun.training.bucketing import check_bucket
from accumrun.training.distribute import strategy_scope
from accumrun.training.feed_choice import FeedChoice, choose_feed
from accumrun.training.measurements import measurement_observers

T = TypeVar("T")


def resolve_batch_size(training: TrainingConfig, train_size: int) -> int:
    """The batch size in samples (``full``: the training set); ConfigError if too large, or under subdivisions."""
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


@dataclass(frozen=True, kw_only=True)
class Trained:
    """What is trained: the model (its input preprocessing in front), the optimizer, and the loss and metrics."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    objective: FittedObjective
    val_metrics: MetricSet
    rescale: float
    """What the model's input layer multiplies raw samples by."""
    preprocess: Preprocess | None
    """A pretrained application's own ``preprocess_input`` (its ``rescale: auto``), or None."""
    remat: str = ""
    """The startup line of ``training.remat``: what the backward pass recomputes (empty for none)."""

    @property
    def loss_scaled(self) -> bool:
        """Whether the optimizer scales the loss (``mixed_float16``), and so skips the updates that overflow."""
        return isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)


@dataclass(frozen=True, kw_only=True)
class Fed:
    """What is fed: the samples (augmented), in which order and batches, and how the batches reach the step."""

    dataset: Dataset
    augmentation: Augmentation | None
    batch_size: int
    drop_remainder: bool
    seed: int
    shuffle: bool
    by_length: bool
    """Whether each training batch is ordered by its samples' lengths (bucketed padding, ``data.bucket``)."""
    feed_choice: FeedChoice

    @property
    def feed(self) -> Feed:
        """How batches reach the step: whole, or as streamed sub-batches."""
        return self.feed_choice.feed

    @property
    def several_updates_per_call(self) -> bool:
        """Whether one compiled call may run several updates: the training arrays are held as one tensor (arrays
        without augmentation, see :mod:`accumrun.data.resident`) or read in one gather per batch (the disk cache,
        :func:`~accumrun.data.feeder.gathers`), and batches come whole."""
        train, augmented = self.dataset.train, self.augmentation is not None
        return (resides(train, augmented) or gathers(train, augmented)) and self.feed is Feed.BATCH

    @property
    def epoch_batch_sizes(self) -> list[int]:
        """The sample count of each batch of an epoch."""
        return batch_sizes(self.dataset.train_size, self.batch_size, self.drop_remainder)

    def chunk_sizes(self, subdivisions: int) -> list[list[int]]:
        """Each batch of an epoch as the chunks the feeder serves it in: the whole batch, or its sub-batches."""
        whole = self.feed is Feed.BATCH
        return [[size] if whole else sub_batch_sizes(size, subdivisions) for size in self.epoch_batch_sizes]

    def train_feeder(self, chunk_sizes: list[int]) -> Feeder:
        """The training samples in chunks of ``chunk_sizes``, augmented, in the seed's order (with bucketed padding,
        each batch ordered by length: :mod:`accumrun.data.grouping`)."""
        return Feeder(
            self.dataset.train,
            chunk_sizes,
            seed=self.seed,
            shuffle=self.shuffle,
            augmentation=self.augmentation,
            on_device=True,
            group_by_length=self.epoch_batch_sizes if self.by_length else None,
        )

    def val_feeder(self, batch_size: int) -> Feeder:
        """The validation samples in batches of ``batch_size``, in their order, augmentation in inference mode."""
        if self.dataset.val is None:
            raise ValueError("the dataset has no validation split")
        return Feeder(
            self.dataset.val,
            batch_sizes(self.dataset.val_size, batch_size),
            seed=self.seed,
            shuffle=False,
            augmentation=self.augmentation,
            training=False,
            on_device=True,
        )

    def inference_chunks(self, chunk_size: int, limit: int | None) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        """The training samples (or ``limit`` of them, a seeded subset), targets and weights too, in their order in
        chunks of ``chunk_size``, augmentation in inference mode."""
        train = self.dataset.train
        if limit is not None and limit < train.size:
            chosen = np.random.default_rng(self.seed).permutation(train.size)[:limit]
            train = train.subset(np.sort(chosen))
        feeder = Feeder(
            train,
            batch_sizes(train.size, chunk_size),
            seed=self.seed,
            shuffle=False,
            augmentation=self.augmentation,
            training=False,
        )
        return iter(feeder.epoch(0))

    def first_batch(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The first batch of the first epoch, as the run will see it."""
        return _first(self.train_feeder([self.batch_size]))


@dataclass(frozen=True, kw_only=True)
class Stepped:
    """How it is stepped: the step's options and its subdivisions, and what ``batch_norm: precise`` recomputes over."""

    spec: StepSpec
    """The train step's options but its subdivisions, which :meth:`step_spec` sets."""
    subdivisions: int | None
    """None while ``training.subdivisions`` is ``auto``, until :func:`settle_subdivisions`."""
    precise_bn_samples: int | None
    """How many training samples (seeded) population statistics are computed over; None: all of them."""

    @property
    def strategy(self) -> tf.distribute.Strategy | None:
        """The strategy the variables live under, or None for one device."""
        return self.spec.strategy

    @property
    def replicas(self) -> int:
        """How many replicas share each batch (1 without a strategy)."""
        return self.strategy.num_replicas_in_sync if self.strategy is not None else 1

    @property
    def train_metrics(self) -> MetricSet:
        """The training metrics the step updates."""
        return _given(self.spec.metrics)

    @property
    def batch_norm(self) -> BatchNormStatistics:
        """The BatchNorm mode and statistics the step keeps."""
        return _given(self.spec.batch_norm)

    @property
    def draws(self) -> LayerDraws:
        """How the random layers draw."""
        return _given(self.spec.draws)

    def step_spec(self, subdivisions: int) -> StepSpec:
        """The step's options for ``subdivisions``: an observer runs only where a batch has the parts it needs
        (the noise scale two: several subdivisions, or replicas)."""
        parts = subdivisions * self.replicas
        observers = tuple(observer for observer in self.spec.observers if parts >= observer.least_parts)
        return dataclasses.replace(self.spec, subdivisions=subdivisions, observers=observers)


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """What a run trains, resolved into its parts: what is trained, what is fed, and how it is stepped. ``config``
    has what it left to accumrun filled in, to be recorded (``config.yaml``) and described; the parts read their
    typed fields, resolved from it once."""

    config: Config
    trained: Trained
    fed: Fed
    stepped: Stepped

    def make_step(self, subdivisions: int) -> TrainStep:
        """Compile the train step for ``subdivisions`` (see :func:`accumrun.core.step.make_train_step`)."""
        trained, stepped = self.trained, self.stepped
        with strategy_scope(stepped.strategy):
            return make_train_step(
                trained.model, trained.objective.objective, trained.optimizer, stepped.step_spec(subdivisions)
            )

    def model_to_save(self) -> keras.Model:
        """The model as ``model.keras`` holds it: on raw samples of the stored size (centre-cropped if augmented)."""
        dataset = self.fed.dataset
        return at_stored_size(self.trained.model, dataset.sample_shape, dataset.dtype)


def build_training(
    config: Config, strategy: tf.distribute.Strategy | None = None, *, resumed: Path | None = None
) -> TrainingSetup:
    """Load the data, build the model, its loss and metrics, and the optimizer, from the seed (the variables in
    ``strategy``'s scope); settle every ``auto`` but ``subdivisions``. A learned vocabulary is learned, or for a
    ``resumed`` run read from its folder, and carried in the resolved config for the run to save.

    Raises:
        ConfigError: the model, loss, metrics, optimizer, class weights or sizes do not fit the config or the
            data.
        DataError: the data cannot be loaded or does not fit the model.
    """
    config = config.model_copy(update={"data": settle_vocabulary(config.data, config.seed, resumed)})
    # Class weights weight the training samples alone (validation, as Keras', is unweighted by class).
    training = config.training
    dataset = load_dataset(config.data, config.seed, sample_floats(training.precision))
    dataset = with_class_weights(dataset, training.class_weight)
    batch_size = resolve_batch_size(training, dataset.train_size)
    _check_measurements(training, dataset.train_size, distributed=strategy is not None)
    feed_choice = _feed(config, dataset, batch_size, strategy is not None)
    augment = config.data.augment
    augmentation = Augmentation(augment, dataset.sample_shape, dataset.dtype) if augment else None
    rescale, preprocess = _rescaling(config, dataset)
    trained, dataset, spec = _build_trained(
        config, dataset, augmentation, rescale, preprocess, feed_choice.feed, strategy
    )
    # config.yaml records what the config left to accumrun; rescale stays auto where an application's own
    # preprocess_input scales.
    resolved_data = config.data.model_copy(
        update={
            "task": dataset.task,
            "rescale": "auto" if preprocess is not None else rescale,
            "feed": feed_choice.feed,
        }
    )
    return TrainingSetup(
        config=config.model_copy(
            update={"data": resolved_data, "loss": trained.objective.loss, "metrics": trained.objective.metrics}
        ),
        trained=trained,
        fed=Fed(
            dataset=dataset,
            augmentation=augmentation,
            batch_size=batch_size,
            drop_remainder=training.drop_remainder,
            seed=config.seed,
            shuffle=config.data.shuffle,
            by_length=config.data.token_bucket is not None,
            feed_choice=feed_choice,
        ),
        stepped=Stepped(
            spec=spec, subdivisions=training.fixed_subdivisions, precise_bn_samples=training.precise_bn_samples
        ),
    )


def _build_trained(
    config: Config,
    dataset: Dataset,
    augmentation: Augmentation | None,
    rescale: float,
    preprocess: Preprocess | None,
    feed: Feed,
    strategy: tf.distribute.Strategy | None,
) -> tuple[Trained, Dataset, StepSpec]:
    """The model with its objective and optimizer, from the seed, in ``strategy``'s scope and the run's float type;
    the dataset settled by the model's output where its task is ``auto``; and the step's spec."""
    training = config.training
    keras.utils.set_random_seed(config.seed)
    with strategy_scope(strategy), floats(training.precision):
        model = _build_model(config, dataset, augmentation, rescale, preprocess)
        check_float64(model, training.precision)
        check_bucket(config, dataset, model)
        if config.data.task == "auto":
            dataset = dataset.settled_by_output(model.output_shape[-1])
        # Two samples as the model takes them, to check that the loss gives one value per sample.
        first_two = dataset.train.subset(np.arange(min(2, dataset.train_size)))
        probe = Feeder(first_two, [first_two.size], seed=config.seed, shuffle=False, augmentation=augmentation)
        objective = fit_objective(config, dataset, model, _first(probe))
        optimizer = _optimizer(config, model)
        # Last of what changes the model's layers: it recomputes whichever layers the model trains with.
        remat = apply_remat(model, settle_remat(training.remat), kind_of(config.model).blocks)
        spec = _step_spec(config, model, objective.objective, optimizer, feed, strategy)
        val_metrics = objective.objective.new_metrics()
    trained = Trained(
        model=model,
        optimizer=optimizer,
        objective=objective,
        val_metrics=val_metrics,
        rescale=rescale,
        preprocess=preprocess,
        remat=remat,
    )
    return trained, dataset, spec


def _step_spec(
    config: Config,
    model: keras.Model,
    objective: Objective,
    optimizer: keras.optimizers.Optimizer,
    feed: Feed,
    strategy: tf.distribute.Strategy | None,
) -> StepSpec:
    """The step's options (its subdivisions are settled later); the optimizer kind's refusals of the model, and the
    inference mode of a kind that needs the same objective at the same weights."""
    training, kind = config.training, config.optimizer.kind
    problem = model_problem(kind, training.batch_norm, has_batch_norm=bool(batch_norm_layers(model)))
    if problem is not None:
        raise ConfigError(*problem)
    return StepSpec(
        feed=feed,
        metrics=objective.new_metrics(),
        batch_norm=BatchNormStatistics(model, training.batch_norm, strategy),
        # Before any checkpoint is restored: the generators' initial seeds come from the config's seed.
        draws=LayerDraws(model, optimizer.iterations, training.random_draws),
        bucket=config.data.token_bucket,
        jit_compile=training.jit_compile,
        strategy=strategy,
        observers=measurement_observers(training, optimizer.iterations),
        inference_mode=kind.same_objective,
    )


def _check_measurements(training: TrainingConfig, train_size: int, *, distributed: bool) -> None:
    """Refuse a measurement made on one device across replicas (``distribute.strategy: auto`` settles only now; the
    config's check refuses the others), and ``measure_samples`` beyond the training set."""
    refused = next(one_device_refusals(training.measure, "not across replicas"), None) if distributed else None
    if refused is not None:
        raise ConfigError(*refused)
    if training.measure_samples != "all" and training.measure_samples > train_size:
        raise ConfigError(
            "training.measure_samples",
            f"is larger than the {train_size:,} training samples; use all",
            training.measure_samples,
        )


def _feed(config: Config, dataset: Dataset, batch_size: int, distributed: bool) -> FeedChoice:
    """``data.feed`` settled, and why (see :func:`choose_feed`).

    Raises:
        ConfigError: ``subdivisions: auto`` on a run that streams sub-batches (auto tries whole batches).
    """
    choice = choose_feed(config.data.feed, dataset, batch_size, distributed)
    if choice.feed is Feed.SUB_BATCH and config.training.fixed_subdivisions is None:
        raise ConfigError(
            "training.subdivisions",
            f"auto tries whole batches, and this run streams sub-batches ({choice.reason}); set a number",
            "auto",
        )
    return choice


def _optimizer(config: Config, model: keras.Model) -> keras.optimizers.Optimizer:
    """The configured optimizer (loss-scaled under ``mixed_float16``), built now, so its state exists before the
    first step (checkpoints and auto's tries restore it)."""
    optimizer = build_optimizer(config.optimizer)
    if config.training.precision is Precision.MIXED_FLOAT16:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    return optimizer


def _build_model(
    config: Config, dataset: Dataset, augmentation: Augmentation | None, rescale: float, preprocess: Preprocess | None
) -> keras.Model:
    """The configured model under ``training.precision``, with the input preprocessing in front."""
    input_shape = augmentation.output_shape if augmentation is not None else dataset.sample_shape
    previous_policy = keras.mixed_precision.dtype_policy()
    # The policy is global in Keras; layers keep the one they were built with, so restore it at once.
    keras.mixed_precision.set_dtype_policy(config.training.precision.value)
    try:
        model = build_model(
            config.model,
            input_shape,
            dataset.outputs,
            dataset.vocabulary_size,
            per_position=dataset.task is Task.CAUSAL_LM,
            any_length=config.data.token_bucket is not None,
        )
        return with_input_preprocessing(model, input_shape, dataset.dtype, rescale, config.data.normalize, preprocess)
    finally:
        keras.mixed_precision.set_dtype_policy(previous_policy)


def _rescaling(config: Config, dataset: Dataset) -> tuple[float, Preprocess | None]:
    """``data.rescale`` settled: ``auto`` is an application's ``preprocess_input`` (on 0..255) or the source's scale."""
    rescale = config.data.rescale
    if rescale != "auto":
        return (1.0 if rescale is False else float(rescale)), None
    preprocess = kind_of(config.model).preprocessing(config.model)
    return (1.0, preprocess) if preprocess is not None else (dataset.scale, None)


def _given(value: T | None) -> T:
    """A spec's optional field that a setup always sets."""
    assert value is not None, "a setup's step spec sets its metrics, BatchNorm statistics and draws"
    return value


def _first(feeder: Feeder) -> tuple[tf.Tensor, tf.Tensor]:
    return next(iter(feeder.epoch(0)))
