"""The config schema: the root :class:`Config`, its unions, and the ``training`` section, each with its per-key
rules; the rules that span keys are declared by the section or feature that owns them, and collected here in turn.

``data``, ``model`` and ``optimizer`` are unions chosen by ``name``, so a key the chosen section does not read is
refused; their sections live beside their loaders and builds, registered in :data:`accumrun.data.registry.SOURCES`,
:data:`accumrun.models.registry.MODELS` and :data:`accumrun.optim.optimizers.OPTIMIZERS`. The other sections have
modules of their own in this package. Closed sets parse into the enums of :mod:`accumrun.kinds`, written back as
words. Loading and messages: :mod:`accumrun.config.loading`. Nothing here imports TensorFlow (``check`` stays fast).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

import yaml
from pydantic import BaseModel, Discriminator, Field, TypeAdapter, field_validator

from accumrun.config.distribute import DistributeConfig
from accumrun.config.loss import LossConfig, MetricEntry
from accumrun.config.measures import measurement_rules
from accumrun.config.memory_budget import MemoryBudget, size_bytes
from accumrun.config.output import OutputConfig
from accumrun.config.precision import precision_problems
from accumrun.config.remat import remat_rules
from accumrun.data.arrays import DigitsConfig
from accumrun.data.registry import DATA_SECTIONS
from accumrun.data.section import DataSection
from accumrun.data.tokenizers import TOKENIZER_UNION
from accumrun.errors import describe
from accumrun.kinds import BatchNormMode, Measure, OnNonFinite, Precision, RandomDraws, Remat, Strategy
from accumrun.models.kind import ModelSection
from accumrun.models.registry import DEFAULT_MODEL, MODEL_SECTIONS, UNKNOWN_MODEL, model_tag
from accumrun.optim.keras_optimizer import OptimizerConfig
from accumrun.optim.optimizers import OPTIMIZERS, optimizer_tag
from accumrun.optim.rules import optimizer_problems
from accumrun.optim.section import OptimizerSection
from accumrun.sections import Flag, Problem, Section, Unknown, Watched, by_name, int_or, listed, tagged_union, words


class _UnknownDataConfig(DataSection, Unknown):
    refusal = f"input should be {listed(list(DATA_SECTIONS))}"
    name: Any  # not DataSection's str: a name of any type gets the refusal


_DATA_UNION: dict[str, type[DataSection]] = {**DATA_SECTIONS, "unknown": _UnknownDataConfig}

if TYPE_CHECKING:
    # mypy cannot follow a union built at run time; every member is a DataSection.
    DataConfig: TypeAlias = DataSection
else:
    DataConfig = tagged_union(_DATA_UNION, by_name(DATA_SECTIONS, default="digits"))
    """The ``data`` section: one section per source, chosen by ``name`` (``digits`` when it is unset)."""

_DATA_ADAPTER: TypeAdapter[DataConfig] = TypeAdapter(DataConfig)


def data_config(**keys: Any) -> DataSection:
    """The ``data`` section for ``keys`` (``name`` picks the source), validated as in a config file.

    Raises:
        pydantic.ValidationError: a key the source does not read, or a bad value.
    """
    return _DATA_ADAPTER.validate_python(keys)


def readers_of(key: str) -> list[str]:
    """The ``data.name`` values whose section has ``key``."""
    return [name for name, section in DATA_SECTIONS.items() if key in section.model_fields]


class _UnknownModelConfig(Unknown):
    refusal = UNKNOWN_MODEL


_MODEL_UNION: dict[str, type[BaseModel]] = {**MODEL_SECTIONS, "unknown": _UnknownModelConfig}

if TYPE_CHECKING:
    # mypy cannot follow a union built at run time; every member it admits is a ModelSection.
    ModelConfig: TypeAlias = ModelSection
else:
    ModelConfig = tagged_union(_MODEL_UNION, Discriminator(model_tag))
    """The ``model`` section: one section per kind, chosen by ``name`` (``darknet_cnn`` when it is unset)."""


UNION_SECTIONS: dict[str, dict[str, type[BaseModel]]] = {
    "model": _MODEL_UNION,
    "data": {**_DATA_UNION},
    "tokenizer": {**TOKENIZER_UNION},
}
"""The sections of each union (``data.tokenizer`` too) by their key, then by their tag, which pydantic adds to an
error's location."""
UNION_TAGS = {**{key: set(sections) for key, sections in UNION_SECTIONS.items()}, "learning_rate": {"rate", "schedule"}}


class EarlyStoppingConfig(Watched):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs."""

    patience: int = Field(5, ge=1)
    min_delta: float = Field(0.0, ge=0)


class TrainingConfig(Section):
    epochs: int = Field(10, ge=1)
    batch_size: Annotated[int | Literal["full"], int_or("full", "the whole training set")] = 256
    subdivisions: Annotated[int | Literal["auto"], int_or("auto", "find the fewest that fit in memory")] = 1
    max_sub_batch: int | None = Field(None, ge=1)
    drop_remainder: Flag = False
    on_nonfinite: Annotated[OnNonFinite, words(OnNonFinite)] = OnNonFinite.STOP
    jit_compile: Flag = False
    precision: Annotated[Precision, words(Precision)] = Precision.FLOAT32
    early_stopping: EarlyStoppingConfig | None = None
    batch_norm: Annotated[BatchNormMode, words(BatchNormMode)] = BatchNormMode.PER_BATCH
    """What BatchNorm layers normalize with, and when their moving statistics move (:mod:`accumrun.core.batch_norm`)."""
    random_draws: Annotated[RandomDraws, words(RandomDraws)] = RandomDraws.PER_SAMPLE
    """How dropout and noise layers draw (:mod:`accumrun.core.seeds`): ``per_sample`` makes subdivided training
    equal plain training; ``per_sub_batch`` is how runs before it drew."""
    remat: Annotated[Remat | Literal["auto"], words(Remat, auto=True)] = Remat.NONE
    """What the backward pass recomputes instead of keeping (:mod:`accumrun.config.remat`); never changes a number."""
    precise_bn_samples: int | None = Field(None, ge=1)
    """``batch_norm: precise``: the training samples (a seeded subset) its statistics use; all by default."""
    updates_per_call: Annotated[int | Literal["auto"], int_or("auto", "about half a second of work per call")] = "auto"
    """The most updates one compiled call runs where the data is on the device; a call ends where the host is needed."""
    validate_every: int = Field(1, ge=1)
    """Validate after every N-th epoch, and after the last."""
    measure: list[Annotated[Measure, words(Measure)]] = Field(default_factory=list)
    """What to measure beside training: ``noise_scale`` (what batch size still helps), ``sharpness`` (what step is
    stable), ``hessian_trace`` (the Hessian's trace); what each reads and refuses is :mod:`accumrun.config.measures`."""
    measure_every: int = Field(1, ge=1)
    """``sharpness``, ``hessian_trace``: measured after every N-th epoch."""
    measure_samples: Annotated[int | Literal["all"], int_or("all", "every training sample")] = "all"
    """``sharpness``, ``hessian_trace``: the training samples the Hessian is over (a seeded subset), or all."""
    trace_vectors: int = Field(100, ge=2)
    """``hessian_trace``: how many random vectors its estimate averages over."""
    noise_scale_every: int = Field(1, ge=1)
    """``noise_scale``: measured on one update in every N (those whose index, counted from 0, N divides)."""
    memory_budget: MemoryBudget = None
    """The most the run may peak at (``6GiB``): on a GPU its memory, on a CPU the RSS above the import."""
    class_weight: dict[str, float] | Literal["balanced"] | None = None
    """Class labels only: each class's weight by its name in ``labels.json`` (unnamed classes 1.0), or ``balanced``
    (n_samples / (n_classes * count)). Training only, as Keras' ``class_weight``."""

    @field_validator("measure")
    @classmethod
    def _each_once(cls, value: list[Measure]) -> list[Measure]:
        if len(set(value)) != len(value):
            raise ValueError("names a measurement twice")
        return value

    @field_validator("class_weight", mode="before")
    @classmethod
    def _class_weights(cls, value: Any) -> Any:
        if value is None or value == "balanced":
            return value
        if not isinstance(value, dict) or not value:
            raise ValueError("must be a mapping {class name: weight, ...} or 'balanced'")
        weights = {}
        for name, weight in value.items():
            # YAML reads class indices as numbers; labels.json names them as text.
            key = str(name) if isinstance(name, int) and not isinstance(name, bool) else name
            if not isinstance(key, str):
                raise ValueError(f"class names must be text or class indices, got {name!r}")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight < float("inf"):
                raise ValueError(f"class {key!r}: a weight must be a finite number >= 0, got {weight!r}")
            weights[key] = float(weight)
        return weights

    def broken_rules(self) -> Iterator[Problem]:
        """More sub-batches than samples in a batch: a sub-batch would be empty (:mod:`accumrun.core.sub_batches`)."""
        subdivisions = self.fixed_subdivisions
        if isinstance(self.batch_size, int) and subdivisions is not None and subdivisions > self.batch_size:
            message = f"cannot exceed training.batch_size ({self.batch_size}); each sub-batch needs a sample"
            yield "training.subdivisions", message, subdivisions

    @property
    def budget_bytes(self) -> int | None:
        """``memory_budget`` in bytes, or None."""
        return None if self.memory_budget is None else size_bytes(self.memory_budget)

    @property
    def fixed_subdivisions(self) -> int | None:
        """``subdivisions`` when it is a number; None while it is ``auto`` (not settled yet)."""
        return self.subdivisions if isinstance(self.subdivisions, int) else None


if TYPE_CHECKING:
    # mypy cannot follow a union built at run time; every member offers what OptimizerSection names.
    AnyOptimizerConfig: TypeAlias = OptimizerSection
else:
    AnyOptimizerConfig = tagged_union(
        {tag: kind.section for tag, kind in OPTIMIZERS.items()}, Discriminator(optimizer_tag)
    )
    """The ``optimizer`` section: one section per kind of optimizer (:mod:`accumrun.optim`), chosen by ``name``."""
UNION_SECTIONS["optimizer"] = {tag: kind.section for tag, kind in OPTIMIZERS.items()}
UNION_TAGS["optimizer"] = set(UNION_SECTIONS["optimizer"])


class Config(Section):
    seed: int = Field(0, ge=0)
    data: DataConfig = Field(default_factory=DigitsConfig)
    model: ModelConfig = Field(default_factory=MODEL_SECTIONS[DEFAULT_MODEL])
    loss: LossConfig = Field(default_factory=LossConfig)
    metrics: list[MetricEntry] | None = None
    """Unset, they follow the task: accuracy, binary accuracy, or the mean absolute error for regression."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    optimizer: AnyOptimizerConfig = Field(default_factory=OptimizerConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    distribute: DistributeConfig = Field(default_factory=DistributeConfig)

    def to_yaml(self) -> str:
        """The resolved configuration as YAML, loadable again by :func:`load_config`."""
        resolved = self.model_dump(mode="json")
        if self.data.validation_file:
            # The second file validates; a split would be refused beside it on loading.
            resolved["data"]["validation_split"] = 0.0
        return yaml.safe_dump(resolved, sort_keys=False)

    def with_subdivisions(self, subdivisions: int | Literal["auto"]) -> Config:
        """A copy with ``training.subdivisions`` set (as ``auto`` settles it, or as a variant asks)."""
        training = self.training.model_copy(update={"subdivisions": subdivisions})
        return self.model_copy(update={"training": training})


def cross_field_problems(config: Config) -> list[str]:
    """The problems with the rules that span several keys (the per-key rules live in the sections)."""
    return [describe(key, what, value) for key, what, value in _broken_rules(config)]


def _broken_rules(config: Config) -> Iterator[Problem]:
    """Each broken rule, as the section or feature that owns it declares it, in the order of the sections."""
    training, data, distribute = config.training, config.data, config.distribute
    yield from training.broken_rules()
    yield from data.broken_rules(class_weight=training.class_weight)
    yield from config.model.broken_rules()
    yield from config.model.adaptation_rules()
    yield from optimizer_problems(
        config.optimizer,
        augment=[augment.name for augment in data.augment],
        batch_size=training.batch_size,
        precision=training.precision,
        measure=training.measure,
    )
    yield from distribute.broken_rules(feed=data.feed)
    strategy = str(distribute.strategy)
    # Against the defaults, not the keys given: a run's config.yaml writes every key back.
    changed = {key: value for key, value in training if value != TrainingConfig.model_fields[key].default}
    replicated = distribute.strategy not in ("auto", Strategy.NONE)
    yield from measurement_rules(training.measure, changed, strategy if replicated else None)
    yield from precision_problems(training.precision, distribute.strategy, config.model.quantize)
    yield from remat_rules(training.remat, config.model)
