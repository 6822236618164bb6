"""The config schema: one pydantic model per YAML section, with the per-key rules, and the rules that span keys.

Loading, overrides and error messages are in :mod:`accumrun.config.loading`. This module imports neither
TensorFlow nor Keras, so ``check`` and ``--help`` stay fast.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from accumrun.data.sources import SOURCE_KEYS, SOURCES
from accumrun.errors import describe

TASKS = ("classification", "regression", "multi_label")


class _Section(BaseModel):
    """A config section: strict types (YAML already typed the values) and no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NormalizeConfig(_Section):
    """``(x - mean) / std`` per channel, after ``rescale``: one value per channel, or one for all."""

    mean: list[float] = Field(min_length=1)
    std: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)


class AugmentConfig(BaseModel):
    """A Keras image preprocessing layer by name (``random_flip``, ``random_crop``, ...); other keys are its
    keywords (``mode: horizontal``, ``height: 56``)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str

    @property
    def keywords(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class DataConfig(_Section):
    name: str = "digits"
    path: str | None = None
    validation_split: float | Literal["test"] = 0.1
    shuffle: bool = True
    samples: int = Field(2048, ge=1)
    shape: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [28, 28, 1], min_length=1)
    classes: int = Field(10, ge=2)
    task: Literal["auto", "classification", "regression", "multi_label"] = "auto"
    """What the targets are; ``auto`` reads them (see :func:`accumrun.data.dataset.infer_task`)."""
    validation_path: str | None = None
    """A second folder or file of the same kind to validate on, instead of ``validation_split``."""
    image_size: list[int] | None = None
    """image_folder, tfrecord: ``[height, width]`` to resize every image to after decoding (required)."""
    color_mode: Literal["rgb", "grayscale"] = "rgb"
    image_key: str = "image/encoded"
    label_key: str = "image/class/label"
    label: str | None = None
    """csv: the label column; the other columns are the features."""
    shuffle_buffer: int = Field(10_000, ge=1)
    """tfrecord, tfds: the seeded shuffle buffer after the per-epoch permutation of the files."""
    dataset: str | None = None
    """tfds: the name of a dataset prepared in ``data_dir`` (accumrun never downloads it)."""
    data_dir: str | None = None
    rescale: float | Literal["auto"] | bool = "auto"
    """A factor the raw samples are multiplied by on the device: ``auto`` is 1/255 for uint8 images (1/16 for the
    bundled digits' counts, none for floats), ``false`` none."""
    normalize: NormalizeConfig | None = None
    augment: list[AugmentConfig] = Field(default_factory=list)
    """Training only: Keras image preprocessing layers by name, drawn per (seed, epoch, sample)."""
    feed: Literal["auto", "batch", "sub_batch"] = "auto"
    """How batches reach the step: whole (``batch``), or streamed one sub-batch at a time (``sub_batch``), when
    the batch itself does not fit; ``auto`` follows the memory estimate."""

    @field_validator("image_size", mode="before")
    @classmethod
    def _two_positive_integers(cls, value: Any) -> Any:
        if value is None:
            return value
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        ):
            raise ValueError("must be two positive integers [height, width]")
        return value

    @field_validator("rescale", mode="before")
    @classmethod
    def _factor(cls, value: Any) -> Any:
        if value is False or value == "auto":  # not `in`: 0 == False would let a factor of 0 through
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError("must be 'auto', false, or a positive factor such as 0.00392156862745098 (1/255)")
        return float(value)

    @property
    def channels(self) -> int:
        """Channels of a decoded image: 3 for ``rgb``, 1 for ``grayscale``."""
        return 3 if self.color_mode == "rgb" else 1

    @field_validator("name")
    @classmethod
    def _known_source(cls, value: str) -> str:
        if value not in SOURCES:
            *others, last = (repr(name) for name in SOURCES)
            raise ValueError(f"input should be {', '.join(others)} or {last}")
        return value

    @field_validator("validation_split", mode="before")
    @classmethod
    def _fraction_or_test(cls, value: Any) -> Any:
        if value == "test":
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise ValueError("must be a fraction in [0, 1) or 'test' (the dataset's test split)")
        return float(value)


class DarknetCnnConfig(_Section):
    name: Literal["darknet_cnn"] = "darknet_cnn"
    filters: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [32, 64, 96], min_length=1)
    strides: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [2, 2, 1], min_length=1)
    leaky_alpha: float = Field(0.1, ge=0)


class MlpConfig(_Section):
    name: Literal["mlp"]
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    dropout: float = Field(0.0, ge=0, lt=1)


class CustomModelConfig(BaseModel):
    """``name: package.module:function``; every other key is passed to the function as a keyword."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


APPLICATION_PREFIX = "keras.applications."


class ApplicationConfig(BaseModel):
    """``name: keras.applications.<Constructor>``: a Keras application, by default without its classifier and
    with a new head sized to the task; every other key is passed to the constructor (``alpha``, ...)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(pattern=r"^keras\.applications\.[A-Za-z_]\w*$")
    weights: str | None = None
    """None (random), ``imagenet`` (Keras downloads them) or the path of a weights file."""
    include_top: bool = False
    pooling: Literal["avg", "max"] | None = "avg"
    freeze_base: bool = False

    @property
    def constructor(self) -> str:
        """The constructor's name in ``keras.applications``, such as ``MobileNetV2``."""
        return self.name.removeprefix(APPLICATION_PREFIX)

    @property
    def keywords(self) -> dict[str, Any]:
        """The constructor's other keyword arguments."""
        return dict(self.model_extra or {})


class SavedModelConfig(_Section):
    """``name: saved``: a model a user saved with Keras (``.keras`` or ``.h5``), trained as it is."""

    name: Literal["saved"]
    path: str


class _UnknownModelConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Any

    @field_validator("name")
    @classmethod
    def _reject(cls, value: Any) -> Any:
        raise ValueError(
            "unknown model; use darknet_cnn, mlp, keras.applications.<Name>, saved or 'package.module:function'"
        )


MODEL_SECTIONS: dict[str, type[BaseModel]] = {
    "darknet_cnn": DarknetCnnConfig,
    "mlp": MlpConfig,
    "application": ApplicationConfig,
    "saved": SavedModelConfig,
    "custom": CustomModelConfig,
    "unknown": _UnknownModelConfig,
}


def _model_kind(value: Any) -> str:
    name = value.get("name", "darknet_cnn") if isinstance(value, dict) else getattr(value, "name", None)
    if name in ("darknet_cnn", "mlp", "saved"):
        return str(name)
    if isinstance(name, str) and name.startswith(APPLICATION_PREFIX):
        return "application"
    if isinstance(name, str) and ":" in name:
        return "custom"
    return "unknown"


ModelConfig = Annotated[
    Annotated[DarknetCnnConfig, Tag("darknet_cnn")]
    | Annotated[MlpConfig, Tag("mlp")]
    | Annotated[ApplicationConfig, Tag("application")]
    | Annotated[SavedModelConfig, Tag("saved")]
    | Annotated[CustomModelConfig, Tag("custom")]
    | Annotated[_UnknownModelConfig, Tag("unknown")],
    Discriminator(_model_kind),
]


class LossConfig(BaseModel):
    """The loss: any ``keras.losses`` loss by snake_case or class name, or ``package.module:function`` returning
    one value per sample; other keys (``label_smoothing``, ``delta``, ``from_logits``, ...) are its keywords.
    Unset, it follows the task: sparse categorical cross-entropy for class labels, binary cross-entropy for
    multi-label targets; regression needs one named."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str | None = None
    from_logits: bool | None = None
    """Unset, it is read from the model: False when its output layer is a softmax or sigmoid."""

    @property
    def keywords(self) -> dict[str, Any]:
        """The loss's other keyword arguments (``from_logits`` is decided separately)."""
        return dict(self.model_extra or {})


class MetricConfig(BaseModel):
    """A ``keras.metrics`` metric by name, with its keyword arguments: ``{name: top_k_categorical_accuracy, k: 5}``."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str

    @property
    def keywords(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


MetricEntry = str | MetricConfig


UNION_TAGS = {"model": set(MODEL_SECTIONS), "learning_rate": {"rate", "schedule"}}


Mode = Literal["auto", "min", "max"]


class Watched(_Section):
    """A logged figure to watch (``loss``, ``val_accuracy``, ...): ``auto`` minimizes names with "loss" or
    "error" in them and maximizes the others."""

    monitor: str = "val_loss"
    mode: Mode = "auto"

    @property
    def minimize(self) -> bool:
        """Whether lower is better for the monitored figure."""
        if self.mode != "auto":
            return self.mode == "min"
        return "loss" in self.monitor or "error" in self.monitor


class EarlyStoppingConfig(Watched):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs."""

    patience: int = Field(5, ge=1)
    min_delta: float = Field(0.0, ge=0)


class ReduceOnPlateauConfig(Watched):
    """Multiply the learning rate by ``factor`` when ``monitor`` has not improved by more than ``min_delta`` for
    ``patience`` epochs; then wait ``cooldown`` epochs; never below ``min_lr``. A change applies from the next
    epoch's first update."""

    factor: float = Field(0.5, gt=0, lt=1)
    patience: int = Field(3, ge=1)
    min_delta: float = Field(0.0, ge=0)
    cooldown: int = Field(0, ge=0)
    min_lr: float = Field(0.0, ge=0)


class KeepBestConfig(Watched):
    """Keep ``model.best.keras`` from the epoch with the best ``monitor``."""


class TrainingConfig(_Section):
    epochs: int = Field(10, ge=1)
    batch_size: int | Literal["full"] = 256
    subdivisions: int | Literal["auto"] = 1
    max_sub_batch: int | None = Field(None, ge=1)
    drop_remainder: bool = False
    on_nonfinite: Literal["stop", "skip_batch"] = "stop"
    jit_compile: bool = False
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    early_stopping: EarlyStoppingConfig | None = None
    batch_norm: Literal["per_batch", "sub_batch", "precise", "frozen"] = "per_batch"
    """What BatchNorm layers normalize with and when their moving statistics move (see
    :mod:`accumrun.core.batch_norm`)."""
    precise_bn_samples: int | None = Field(None, ge=1)
    """``batch_norm: precise``: the training samples (a seeded subset) that each epoch's population statistics
    are computed over; all of them by default."""

    @field_validator("batch_size", mode="before")
    @classmethod
    def _positive_or_full(cls, value: Any) -> Any:
        if value == "full":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("must be a positive integer or 'full' (the whole training set)")
        return value

    @field_validator("subdivisions", mode="before")
    @classmethod
    def _positive_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("must be a positive integer or 'auto' (find the fewest that fit in memory)")
        return value

    @property
    def fixed_subdivisions(self) -> int | None:
        """``subdivisions`` when it is a number; None while it is ``auto`` (not settled yet)."""
        return self.subdivisions if isinstance(self.subdivisions, int) else None


class ScheduleConfig(BaseModel):
    """A Keras learning-rate schedule by name; other keys are its keyword arguments."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str


def _rate_kind(value: Any) -> str:
    return "schedule" if isinstance(value, dict | ScheduleConfig) else "rate"


LearningRate = Annotated[
    Annotated[float, Tag("rate")] | Annotated[ScheduleConfig, Tag("schedule")],
    Discriminator(_rate_kind),
]


class OptimizerConfig(BaseModel):
    """A Keras optimizer by name; other keys are its keyword arguments, checked when it is built."""

    model_config = ConfigDict(extra="allow", strict=True)
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
    def keywords(self) -> dict[str, Any]:
        """The keyword arguments for the optimizer besides ``name``, ``learning_rate`` and ``reduce_on_plateau``."""
        return dict(self.model_extra or {})


class OutputConfig(_Section):
    run_dir: str = "runs/{config_name}-{timestamp}"
    tensorboard: bool = True
    log_every_updates: int | None = Field(None, ge=1)
    checkpoint_every_updates: int | None = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    keep_best: str | KeepBestConfig | None = None
    """A logged figure (``val_loss``), or ``{monitor: ..., mode: ...}``: keep ``model.best.keras`` from its best
    epoch."""

    @property
    def best(self) -> KeepBestConfig | None:
        """``keep_best`` as a monitor and mode."""
        return KeepBestConfig(monitor=self.keep_best) if isinstance(self.keep_best, str) else self.keep_best


class DistributeConfig(_Section):
    """Where the replicas of the step run: one device (``none``), the local GPUs (``mirrored``), or several hosts
    (``multi_worker``, cluster from ``TF_CONFIG`` or Slurm). ``auto`` is ``mirrored`` with more than one GPU, else
    ``none``."""

    strategy: Literal["none", "auto", "mirrored", "multi_worker"] = "none"
    logical_cpus: int | None = Field(None, ge=1)
    cluster: Literal["auto", "tf_config", "slurm"] = "auto"
    """``multi_worker``: where the cluster is described: ``TF_CONFIG``, Slurm's variables, or whichever is set."""
    timeout_seconds: int = Field(300, ge=1)
    """``multi_worker``: how long a collective waits for a worker that stopped answering before the run ends."""


class Config(_Section):
    seed: int = Field(0, ge=0)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=DarknetCnnConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    metrics: list[MetricEntry] | None = None
    """Unset, they follow the task: accuracy, binary accuracy, or the mean absolute error for regression."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    distribute: DistributeConfig = Field(default_factory=DistributeConfig)

    def to_yaml(self) -> str:
        """The resolved configuration as YAML, loadable again by :func:`load_config`."""
        resolved = self.model_dump(mode="json")
        # Keys that this source does not read would be refused on loading.
        for key in SOURCE_KEYS:
            if key not in SOURCES[self.data.name].keys:
                del resolved["data"][key]
        if self.data.validation_path:
            # The second file validates; a split would be refused beside it on loading.
            resolved["data"]["validation_split"] = 0.0
        return yaml.safe_dump(resolved, sort_keys=False)

    def with_subdivisions(self, subdivisions: int | Literal["auto"]) -> Config:
        """A copy with ``training.subdivisions`` set (as ``auto`` settles it, or as a variant asks)."""
        training = self.training.model_copy(update={"subdivisions": subdivisions})
        return self.model_copy(update={"training": training})


def cross_field_problems(config: Config) -> list[str]:
    """Rules that span several keys; the per-key rules live in the schema."""
    problems = []
    training = config.training
    subdivisions = training.fixed_subdivisions
    if isinstance(training.batch_size, int) and subdivisions is not None and subdivisions > training.batch_size:
        problems.append(
            describe(
                "training.subdivisions",
                f"cannot exceed training.batch_size ({training.batch_size}); each sub-batch needs a sample",
                training.subdivisions,
            )
        )
    problems += _data_problems(config)
    model = config.model
    if isinstance(model, DarknetCnnConfig) and len(model.filters) != len(model.strides):
        problems.append(
            describe(
                "model.strides",
                f"needs one stride per entry of model.filters ({len(model.filters)})",
                model.strides,
            )
        )
    if isinstance(model, ApplicationConfig) and model.freeze_base and model.include_top:
        problems.append(
            describe("model.freeze_base", "trains a new head on a frozen base; it needs include_top: false", True)
        )
    optimizer = config.optimizer
    if optimizer.reduce_on_plateau is not None and isinstance(optimizer.learning_rate, ScheduleConfig):
        problems.append(
            describe(
                "optimizer.reduce_on_plateau",
                f"cannot change a learning-rate schedule ({optimizer.learning_rate.name}); use a number",
                optimizer.reduce_on_plateau.monitor,
            )
        )
    distribute = config.distribute
    if config.data.feed == "sub_batch" and distribute.strategy not in ("none", "auto"):
        problems.append(
            describe(
                "data.feed",
                f"sub_batch streams on one device, not with distribute.strategy: {distribute.strategy}",
                "sub_batch",
            )
        )
    if distribute.logical_cpus is not None and distribute.strategy != "mirrored":
        problems.append(
            describe(
                "distribute.logical_cpus",
                f"splits the CPU into replicas for distribute.strategy: mirrored, not {distribute.strategy}",
                distribute.logical_cpus,
            )
        )
    if training.precision == "mixed_float16" and distribute.strategy != "none":
        # The replicated step does not scale the loss; float16 gradients would underflow unnoticed.
        problems.append(
            describe(
                "training.precision",
                "mixed_float16 (loss scaling) runs on one device only; use mixed_bfloat16 with distribute",
                training.precision,
            )
        )
    return problems


_PATH_NEEDS = {
    "npz": "the path of an .npz file",
    "image_folder": "a folder with one subfolder of images per class",
    "tfrecord": "a TFRecord file or a glob of them",
    "csv": "the path of a .csv file",
}


def _data_problems(config: Config) -> list[str]:
    """The ``data`` keys that the source does not read, or that it needs and lacks."""
    data = config.data
    source = SOURCES[data.name]
    problems = [
        describe(f"data.{key}", f"only applies to data.name: {_readers_of(key)}", getattr(data, key))
        for key in SOURCE_KEYS
        if key in data.model_fields_set and key not in source.keys and getattr(data, key) is not None
    ]
    if source.path == "required" and not data.path:
        problems.append(describe("data.path", f"data.name: {data.name} needs {_PATH_NEEDS.get(data.name, 'a path')}"))
    if source.path == "unused" and data.path:
        problems.append(describe("data.path", f"is not used by data.name: {data.name}", data.path))
    if "image_size" in source.keys and data.image_size is None:
        problems.append(
            describe("data.image_size", f"data.name: {data.name} needs [height, width] to resize images to")
        )
    if "dataset" in source.keys and not data.dataset:
        problems.append(describe("data.dataset", f"data.name: {data.name} needs the name of a prepared dataset"))
    if "label" in source.keys and not data.label:
        problems.append(describe("data.label", f"data.name: {data.name} needs the name of the label column"))
    if data.validation_path and "validation_split" in data.model_fields_set and data.validation_split != 0:
        problems.append(
            describe("data.validation_split", "cannot be set with data.validation_path; use one", data.validation_split)
        )
    return problems


def _readers_of(key: str) -> str:
    return " or ".join(name for name, source in SOURCES.items() if key in source.keys)
