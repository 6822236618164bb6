"""The config schema: one pydantic model per YAML section, with the per-key rules, and the rules that span keys.

``data`` and ``model`` are unions chosen by ``name``, so a key the chosen section does not read is refused; the data
sections live beside their loaders, registered in :data:`accumrun.data.sources.SOURCES`. Closed sets parse into the
enums of :mod:`accumrun.kinds` and are written back as their words. Loading and messages are in
:mod:`accumrun.config.loading`. Nothing here imports TensorFlow, so ``check`` and ``--help`` stay fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

import yaml
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.functional_validators import BeforeValidator

from accumrun.config.measures import measurement_rules
from accumrun.data.arrays import DigitsConfig
from accumrun.data.section import DataSection, Keywords
from accumrun.data.sources import DATA_SECTIONS
from accumrun.data.tokenizer_sections import TOKENIZERS, Unknown, UnknownTokenizerConfig, by_name
from accumrun.errors import describe
from accumrun.kinds import (
    BatchNormMode,
    Cluster,
    Direction,
    Feed,
    LineSearch,
    Measure,
    OnNonFinite,
    Precision,
    RandomDraws,
    Strategy,
)
from accumrun.sections import Flag, Section, listed, words


class _UnknownDataConfig(DataSection, Unknown):
    refusal = f"input should be {listed(list(DATA_SECTIONS))}"
    name: Any  # not DataSection's str: a name of any type gets the refusal


_DATA_UNION: dict[str, type[DataSection]] = {**DATA_SECTIONS, "unknown": _UnknownDataConfig}

if TYPE_CHECKING:
    # mypy cannot follow a union built at run time; every member is a DataSection.
    DataConfig: TypeAlias = DataSection
else:
    DataConfig = Annotated[
        Union[tuple(Annotated[section, Tag(name)] for name, section in _DATA_UNION.items())],  # noqa: UP007
        by_name(DATA_SECTIONS, default="digits"),
    ]
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


class DarknetCnnConfig(Section):
    name: Literal["darknet_cnn"] = "darknet_cnn"
    filters: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [32, 64, 96], min_length=1)
    strides: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [2, 2, 1], min_length=1)
    leaky_alpha: float = Field(0.1, ge=0)


class MlpConfig(Section):
    name: Literal["mlp"]
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    dropout: float = Field(0.0, ge=0, lt=1)
    l2: float = Field(0.0, ge=0)
    """Keras' ``L2`` on every kernel: this factor times the sum of their squares is added to the loss (with the
    mean loss and no hold-out, scikit-learn's ``C`` is ``l2 = 1 / (2 C N)``)."""


class TransformerConfig(Section):
    """``name: transformer``: a Transformer encoder over token ids, pooled over the real tokens into logits."""

    name: Literal["transformer"]
    layers: int = Field(2, ge=1)
    heads: int = Field(2, ge=1)
    width: int = Field(64, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    attention_bias: Flag = False
    """Biases in the attention's projections. Off, as in most current transformers: the key's bias has a true
    gradient of exactly 0 (the softmax ignores it), and Adam would turn float noise there into steps. A run's
    config.yaml records it; one without it, from before the key, had them, and resumes with them."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerConfig:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads ({self.heads})")
        return self


class CustomModelConfig(Keywords):
    """``name: package.module:function``; every other key is passed to the function as a keyword."""

    name: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


APPLICATION_PREFIX = "keras.applications."
KERAS_HUB_PREFIX = "keras_hub.models."


class ApplicationConfig(Keywords):
    """``name: keras.applications.<Constructor>``: a Keras application, by default without its classifier and
    with a new head sized to the task; every other key is passed to the constructor (``alpha``, ...)."""

    name: str = Field(pattern=r"^keras\.applications\.[A-Za-z_]\w*$")
    weights: str | None = None
    """None (random), ``imagenet`` (Keras downloads them) or the path of a weights file."""
    include_top: Flag = False
    pooling: Literal["avg", "max"] | None = "avg"
    freeze_base: Flag = False

    @property
    def constructor(self) -> str:
        """The constructor's name in ``keras.applications``, such as ``MobileNetV2``."""
        return self.name.removeprefix(APPLICATION_PREFIX)


class KerasHubConfig(Keywords):
    """``name: keras_hub.models.<Name>Backbone``: a KerasHub backbone over token ids, with a head for the task; a
    local ``preset``, or built at random from the other keys (``vocabulary_size`` and ``max_sequence_length``
    default to the tokenizer's and ``data.sequence_length``)."""

    name: str = Field(pattern=r"^keras_hub\.models\.[A-Za-z_]\w*$")
    preset: str | None = None
    """A folder that ``save_to_preset`` wrote (nothing is downloaded)."""

    @property
    def constructor(self) -> str:
        """The class name in ``keras_hub.models``, such as ``GPT2Backbone``."""
        return self.name.removeprefix(KERAS_HUB_PREFIX)

    @model_validator(mode="after")
    def _preset_or_keys(self) -> KerasHubConfig:
        if self.preset is not None and self.model_extra:
            raise ValueError(f"a preset is loaded as saved: drop {', '.join(sorted(self.model_extra))}")
        return self


class SavedModelConfig(Section):
    """``name: saved``: a model a user saved with Keras (``.keras`` or ``.h5``), trained as it is."""

    name: Literal["saved"]
    path: str


class _UnknownModelConfig(Unknown):
    refusal = (
        "unknown model; use darknet_cnn, mlp, transformer, keras.applications.<Name>, "
        "keras_hub.models.<Name>Backbone, saved or 'package.module:function'"
    )


MODEL_SECTIONS: dict[str, type[BaseModel]] = {
    "darknet_cnn": DarknetCnnConfig,
    "mlp": MlpConfig,
    "transformer": TransformerConfig,
    "application": ApplicationConfig,
    "keras_hub": KerasHubConfig,
    "saved": SavedModelConfig,
    "custom": CustomModelConfig,
    "unknown": _UnknownModelConfig,
}


def _model_kind(value: Any) -> str:
    name = value.get("name", "darknet_cnn") if isinstance(value, dict) else getattr(value, "name", None)
    if not isinstance(name, str):
        return "unknown"
    if name in ("darknet_cnn", "mlp", "saved", "transformer"):
        return name
    if name.startswith(APPLICATION_PREFIX):
        return "application"
    if name.startswith(KERAS_HUB_PREFIX):
        return "keras_hub"
    return "custom" if ":" in name else "unknown"


ModelConfig = Annotated[
    Annotated[DarknetCnnConfig, Tag("darknet_cnn")]
    | Annotated[MlpConfig, Tag("mlp")]
    | Annotated[TransformerConfig, Tag("transformer")]
    | Annotated[ApplicationConfig, Tag("application")]
    | Annotated[KerasHubConfig, Tag("keras_hub")]
    | Annotated[SavedModelConfig, Tag("saved")]
    | Annotated[CustomModelConfig, Tag("custom")]
    | Annotated[_UnknownModelConfig, Tag("unknown")],
    Discriminator(_model_kind),
]


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

UNION_SECTIONS: dict[str, dict[str, type[BaseModel]]] = {
    "model": MODEL_SECTIONS,
    "data": {**_DATA_UNION},
    "tokenizer": {**TOKENIZERS, "unknown": UnknownTokenizerConfig},
}
"""The sections of each union (``data.tokenizer`` too) by their key, then by their tag, which pydantic adds to an
error's location."""
UNION_TAGS = {**{key: set(sections) for key, sections in UNION_SECTIONS.items()}, "learning_rate": {"rate", "schedule"}}


class Watched(Section):
    """A logged figure to watch: ``auto`` minimizes names with "loss" or "error" in them, maximizes the others."""

    monitor: str = "val_loss"
    mode: Annotated[Literal["auto"] | Direction, words(Direction, auto=True)] = "auto"

    @property
    def minimize(self) -> bool:
        """Whether lower is better for the monitored figure."""
        if self.mode == "auto":
            return "loss" in self.monitor or "error" in self.monitor
        return self.mode == Direction.MIN


class EarlyStoppingConfig(Watched):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs."""

    patience: int = Field(5, ge=1)
    min_delta: float = Field(0.0, ge=0)


class ReduceOnPlateauConfig(Watched):
    """Multiply the learning rate by ``factor`` when ``monitor`` has not improved by more than ``min_delta`` for
    ``patience`` epochs, then wait ``cooldown`` epochs; never below ``min_lr``. It applies from the next epoch."""

    factor: float = Field(0.5, gt=0, lt=1)
    patience: int = Field(3, ge=1)
    min_delta: float = Field(0.0, ge=0)
    cooldown: int = Field(0, ge=0)
    min_lr: float = Field(0.0, ge=0)


class KeepBestConfig(Watched):
    """Keep ``model.best.keras`` from the epoch with the best ``monitor``."""


def _int_or(word: str, meaning: str) -> BeforeValidator:
    """A positive integer or ``word``, whose ``meaning`` the message gives."""

    def check(value: Any) -> Any:
        if value != word and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a positive integer or {word!r} ({meaning})")
        return value

    return BeforeValidator(check)


class TrainingConfig(Section):
    epochs: int = Field(10, ge=1)
    batch_size: Annotated[int | Literal["full"], _int_or("full", "the whole training set")] = 256
    subdivisions: Annotated[int | Literal["auto"], _int_or("auto", "find the fewest that fit in memory")] = 1
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
    precise_bn_samples: int | None = Field(None, ge=1)
    """``batch_norm: precise``: the training samples (a seeded subset) its statistics use; all by default."""
    updates_per_call: Annotated[int | Literal["auto"], _int_or("auto", "about half a second of work per call")] = "auto"
    """The most updates one compiled call runs where the data is on the device; a call ends where the host is needed."""
    validate_every: int = Field(1, ge=1)
    """Validate after every N-th epoch, and after the last."""
    measure: list[Annotated[Measure, words(Measure)]] = Field(default_factory=list)
    """What to measure beside training: ``noise_scale`` (what batch size still helps), ``sharpness`` (what step is
    stable), ``hessian_trace`` (the Hessian's trace); what each reads and refuses is :mod:`accumrun.config.measures`."""
    measure_every: int = Field(1, ge=1)
    """``sharpness``, ``hessian_trace``: measured after every N-th epoch."""
    measure_samples: Annotated[int | Literal["all"], _int_or("all", "every training sample")] = "all"
    """``sharpness``, ``hessian_trace``: the training samples the Hessian is over (a seeded subset), or all."""
    trace_vectors: int = Field(100, ge=2)
    """``hessian_trace``: how many random vectors its estimate averages over."""
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

    @property
    def fixed_subdivisions(self) -> int | None:
        """``subdivisions`` when it is a number; None while it is ``auto`` (not settled yet)."""
        return self.subdivisions if isinstance(self.subdivisions, int) else None


class ScheduleConfig(Keywords):
    """A Keras learning-rate schedule by name; other keys are its keyword arguments."""

    name: str


def _rate_kind(value: Any) -> str:
    return "schedule" if isinstance(value, dict | ScheduleConfig) else "rate"


LearningRate = Annotated[
    Annotated[float, Tag("rate")] | Annotated[ScheduleConfig, Tag("schedule")],
    Discriminator(_rate_kind),
]


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


LBFGS = "lbfgs"
# Keys of the Keras optimizers that mean nothing to L-BFGS, and why; each is refused in one line that says so.
_NOT_FOR_LBFGS = {
    "reduce_on_plateau": "L-BFGS's line search sets each step's length",
    "clipnorm": "a clipped gradient breaks the line search's Wolfe conditions",
    "global_clipnorm": "a clipped gradient breaks the line search's Wolfe conditions",
    "clipvalue": "a clipped gradient breaks the line search's Wolfe conditions",
    "weight_decay": "decay outside the objective breaks the line search; use the model's l2, part of the objective",
}


class LbfgsConfig(Section):
    """``name: lbfgs``: full-batch L-BFGS on the exact gradient (:mod:`accumrun.core.lbfgs`); ``batch_size: full``
    only. Stopping as ``torch.optim.LBFGS`` stops; ``training.epochs`` is the most iterations."""

    name: Literal["lbfgs"]
    learning_rate: float = Field(1.0, gt=0)
    """Scales the first trial step of each line search (as ``torch.optim.LBFGS``'s ``lr``); not a step size."""
    history: int = Field(10, ge=1)
    """How many curvature pairs approximate the inverse Hessian."""
    line_search: Annotated[LineSearch, words(LineSearch)] = LineSearch.STRONG_WOLFE
    tolerance_grad: float = Field(1e-7, ge=0)
    """Converged once the gradient's largest entry is at most this."""
    tolerance_change: float = Field(1e-9, ge=0)
    """Converged once the objective changes by less than this (where that is above the float32 objective's resolution,
    ``|f| * 1.2e-7``), or the step's largest entry is at most this."""
    max_evaluations: int | None = Field(None, ge=1)
    """The most full-batch evaluations over the whole run (None: no limit but ``training.epochs``)."""
    # The keys of _NOT_FOR_LBFGS, each a field that takes nothing, so that its refusal names the key and says why
    # (an unknown key would only list the known ones); reduce_on_plateau is also read wherever any optimizer is.
    reduce_on_plateau: None = Field(None, exclude=True)
    clipnorm: None = Field(None, exclude=True)
    global_clipnorm: None = Field(None, exclude=True)
    clipvalue: None = Field(None, exclude=True)
    weight_decay: None = Field(None, exclude=True)

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _no_schedule(cls, value: Any) -> Any:
        if isinstance(value, dict):
            raise ValueError("a schedule has no meaning for L-BFGS, whose line search sets each step's length")
        return value

    @field_validator(*_NOT_FOR_LBFGS, mode="before")
    @classmethod
    def _meaningless(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(f"has no meaning for L-BFGS: {_NOT_FOR_LBFGS[str(info.field_name)]}")
        return value


def _optimizer_kind(value: Any) -> str:
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    return LBFGS if name == LBFGS else "keras"


AnyOptimizerConfig = Annotated[
    Annotated[OptimizerConfig, Tag("keras")] | Annotated[LbfgsConfig, Tag(LBFGS)],
    Discriminator(_optimizer_kind),
]
"""The ``optimizer`` section: a Keras optimizer by name, or ``lbfgs``."""
UNION_SECTIONS["optimizer"] = {"keras": OptimizerConfig, LBFGS: LbfgsConfig}
UNION_TAGS["optimizer"] = set(UNION_SECTIONS["optimizer"])


def duration_seconds(text: str) -> float:
    """``90s``, ``10min``, ``1.5h`` in seconds.

    Raises:
        ValueError: not a positive number followed by ``s``, ``min`` or ``h``.
    """
    for unit, seconds in {"s": 1, "min": 60, "h": 3600}.items():
        number = text.strip().removesuffix(unit)
        if number != text.strip():
            try:
                value = float(number)
            except ValueError:
                break
            if value > 0:
                return value * seconds
    raise ValueError("must be a duration such as 90s, 10min or 1h, or null for the ends of epochs only")


class OutputConfig(Section):
    run_dir: str = "runs/{config_name}-{timestamp}"
    tensorboard: Flag = True
    log_every_updates: int | None = Field(None, ge=1)
    checkpoint_every: str | None = "10min"
    """How often a checkpoint is written (None: at each epoch's end); also at every stop, signal and the run's end."""
    checkpoint_every_updates: int | None = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    keep_best: str | KeepBestConfig | None = None
    """A logged figure (``val_loss``) or ``{monitor, mode}``: keep ``model.best.keras`` from its best epoch."""

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            duration_seconds(value if isinstance(value, str) else "")
        return value

    @property
    def checkpoint_seconds(self) -> float | None:
        """``checkpoint_every`` in seconds; None for the end of every epoch."""
        return None if self.checkpoint_every is None else duration_seconds(self.checkpoint_every)

    @property
    def best(self) -> KeepBestConfig | None:
        """``keep_best`` as a monitor and mode."""
        return KeepBestConfig(monitor=self.keep_best) if isinstance(self.keep_best, str) else self.keep_best


class DistributeConfig(Section):
    """Where the replicas of the step run: one device (``none``), the local GPUs (``mirrored``), or several hosts
    (``multi_worker``). ``auto`` is ``mirrored`` with more than one GPU, else ``none``."""

    strategy: Annotated[Literal["auto"] | Strategy, words(Strategy, auto=True)] = Strategy.NONE
    logical_cpus: int | None = Field(None, ge=1)
    cluster: Annotated[Literal["auto"] | Cluster, words(Cluster, auto=True)] = "auto"
    """``multi_worker``: where the cluster is described: ``TF_CONFIG``, Slurm's variables, or whichever is set."""
    timeout_seconds: int = Field(300, ge=1)
    """``multi_worker``: how long a collective waits for a worker that stopped answering before the run ends."""


class Config(Section):
    seed: int = Field(0, ge=0)
    data: DataConfig = Field(default_factory=DigitsConfig)
    model: ModelConfig = Field(default_factory=DarknetCnnConfig)
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


def _broken_rules(config: Config) -> Iterator[tuple[str, str, Any]]:
    """Each broken rule as the key to blame, what is wrong and the value given."""
    training, data, model, optimizer = config.training, config.data, config.model, config.optimizer
    subdivisions = training.fixed_subdivisions
    if isinstance(training.batch_size, int) and subdivisions is not None and subdivisions > training.batch_size:
        message = f"cannot exceed training.batch_size ({training.batch_size}); each sub-batch needs a sample"
        yield "training.subdivisions", message, subdivisions
    # A validation file and a validation split at once: which would validate?
    if data.validation_file and "validation_split" in data.model_fields_set and data.validation_split != 0:
        yield "data.validation_split", "cannot be set with data.validation_path; use one", data.validation_split
    weight = getattr(data, "weight", None)
    if weight is not None and training.class_weight is not None:
        # Keras refuses both too.
        message = "cannot be set with data.weight; multiply the class weights into the weight column or array"
        yield "training.class_weight", message, training.class_weight
    if weight is not None and weight in data.named_columns:
        yield "data.weight", "must be a column of its own, not the label or id column", weight
    if isinstance(model, DarknetCnnConfig) and len(model.filters) != len(model.strides):
        yield "model.strides", f"needs one stride per entry of model.filters ({len(model.filters)})", model.strides
    if isinstance(model, ApplicationConfig) and model.freeze_base and model.include_top:
        yield "model.freeze_base", "trains a new head on a frozen base; it needs include_top: false", True
    yield from _lbfgs_rules(config)
    if optimizer.reduce_on_plateau is not None and isinstance(optimizer.learning_rate, ScheduleConfig):
        message = f"cannot change a learning-rate schedule ({optimizer.learning_rate.name}); use a number"
        yield "optimizer.reduce_on_plateau", message, optimizer.reduce_on_plateau.monitor
    distribute = config.distribute
    strategy = str(distribute.strategy)
    if data.feed == Feed.SUB_BATCH and distribute.strategy not in ("auto", Strategy.NONE):
        yield "data.feed", f"sub_batch streams on one device, not with distribute.strategy: {strategy}", "sub_batch"
    if distribute.logical_cpus is not None and distribute.strategy != Strategy.MIRRORED:
        message = f"splits the CPU into replicas for distribute.strategy: mirrored, not {strategy}"
        yield "distribute.logical_cpus", message, distribute.logical_cpus
    # Against the defaults, not the keys given: a run's config.yaml writes every key back.
    changed = {key: value for key, value in training if value != TrainingConfig.model_fields[key].default}
    replicated = distribute.strategy not in ("auto", Strategy.NONE)
    yield from measurement_rules(training.measure, changed, strategy if replicated else None)
    if training.precision == Precision.MIXED_FLOAT16 and distribute.strategy != Strategy.NONE:
        # The replicated step does not scale the loss; float16 gradients would underflow unnoticed.
        message = "mixed_float16 (loss scaling) runs on one device only; use mixed_bfloat16 with distribute"
        yield "training.precision", message, "mixed_float16"


def _lbfgs_rules(config: Config) -> Iterator[tuple[str, str, Any]]:
    """What L-BFGS needs of the rest of the config: the full batch, no augmentation (its objective must be the same
    at the same weights), float32, no noise scale (it takes no minibatch steps). BatchNorm is checked once the model
    is built (:mod:`accumrun.training.setup`)."""
    if not isinstance(config.optimizer, LbfgsConfig):
        return
    training = config.training
    if config.data.augment:
        message = "lbfgs needs the same objective at the same weights; augmentation draws anew every epoch"
        yield "data.augment", message, [augment.name for augment in config.data.augment]
    if training.batch_size != "full":
        message = "lbfgs needs the exact full-batch gradient; set training.batch_size: full"
        yield "training.batch_size", message, training.batch_size
    if training.precision is not Precision.FLOAT32:
        message = "lbfgs needs float32; a mixed-precision objective is too coarse for its line search"
        yield "training.precision", message, str(training.precision)
    if Measure.NOISE_SCALE in training.measure:
        yield "training.measure", "the noise scale measures minibatch steps; lbfgs takes full-batch ones", "noise_scale"
