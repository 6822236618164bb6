"""The YAML schema, loading, ``--set`` overrides and validation.

Precedence is defaults < YAML file < command line. Every problem found is reported at once, each naming its
key path, what is wrong and the value given. This module imports neither TensorFlow nor Keras, so ``check`` and
``--help`` stay fast.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)

from accumrun.errors import ConfigError, ConfigProblems, describe

DATASETS = ("digits", "npz", "mnist", "fashion_mnist", "synthetic")
SYNTHETIC_ONLY_KEYS = ("samples", "shape", "classes")


class _Section(BaseModel):
    """A config section: strict types (YAML already typed the values) and no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True)


class DataConfig(_Section):
    name: Literal["digits", "npz", "mnist", "fashion_mnist", "synthetic"] = "digits"
    path: str | None = None
    validation_split: float | Literal["test"] = 0.1
    shuffle: bool = True
    samples: int = Field(2048, ge=1)
    shape: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [28, 28, 1], min_length=1)
    classes: int = Field(10, ge=2)

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


class _UnknownModelConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Any

    @field_validator("name")
    @classmethod
    def _reject(cls, value: Any) -> Any:
        raise ValueError("unknown model; use darknet_cnn, mlp or 'package.module:function'")


_MODEL_SECTIONS: dict[str, type[BaseModel]] = {
    "darknet_cnn": DarknetCnnConfig,
    "mlp": MlpConfig,
    "custom": CustomModelConfig,
    "unknown": _UnknownModelConfig,
}


def _model_kind(value: Any) -> str:
    name = value.get("name", "darknet_cnn") if isinstance(value, dict) else getattr(value, "name", None)
    if name in ("darknet_cnn", "mlp"):
        return name
    if isinstance(name, str) and ":" in name:
        return "custom"
    return "unknown"


ModelConfig = Annotated[
    Annotated[DarknetCnnConfig, Tag("darknet_cnn")]
    | Annotated[MlpConfig, Tag("mlp")]
    | Annotated[CustomModelConfig, Tag("custom")]
    | Annotated[_UnknownModelConfig, Tag("unknown")],
    Discriminator(_model_kind),
]


_UNION_TAGS = {"model": set(_MODEL_SECTIONS), "learning_rate": {"rate", "schedule"}}


class TrainingConfig(_Section):
    epochs: int = Field(10, ge=1)
    batch_size: int | Literal["full"] = 256
    subdivisions: int | Literal["auto"] = 1
    max_sub_batch: int | None = Field(None, ge=1)
    drop_remainder: bool = False
    on_nonfinite: Literal["stop", "skip_batch"] = "stop"
    jit_compile: bool = False
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"

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
        """The keyword arguments for the optimizer besides ``name`` and ``learning_rate``."""
        return dict(self.model_extra or {})


class OutputConfig(_Section):
    run_dir: str = "runs/{config_name}-{timestamp}"
    tensorboard: bool = True
    log_every_updates: int | None = Field(None, ge=1)
    checkpoint_every_updates: int | None = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)


class DistributeConfig(_Section):
    """Where the replicas of the step run: one device (``none``), the local GPUs (``mirrored``), or several hosts
    (``multi_worker``, cluster from ``TF_CONFIG``). ``auto`` is ``mirrored`` with more than one GPU, else ``none``."""

    strategy: Literal["none", "auto", "mirrored", "multi_worker"] = "none"
    logical_cpus: int | None = Field(None, ge=1)


class Config(_Section):
    seed: int = Field(0, ge=0)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=DarknetCnnConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    distribute: DistributeConfig = Field(default_factory=DistributeConfig)

    def to_yaml(self) -> str:
        """The resolved configuration as YAML, loadable again by :func:`load_config`."""
        resolved = self.model_dump(mode="json")
        if self.data.name != "synthetic":
            # Only synthetic data reads these; written out, they would be refused on loading.
            for key in SYNTHETIC_ONLY_KEYS:
                del resolved["data"][key]
        return yaml.safe_dump(resolved, sort_keys=False)


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Read a YAML config, apply ``key.path=value`` overrides and validate the result.

    Raises:
        ConfigError: the file is missing or not YAML, an override is malformed, or any value is invalid
            (all invalid values are listed in one error).
    """
    path = Path(path)
    raw = _read_yaml(path)
    for override in overrides:
        _apply_override(raw, override)
    try:
        config = Config.model_validate(raw)
    except ValidationError as error:
        raise ConfigProblems(str(path), [_describe_pydantic_error(e) for e in error.errors()]) from None
    problems = _cross_field_problems(config)
    if problems:
        raise ConfigProblems(str(path), problems)
    return config


# What may change when a run is resumed: more epochs, where and how often it writes, and the devices it runs on
# (the replicas share each global batch, so the updates do not depend on how many there are).
_RESUMABLE_CHANGES = ("training.epochs", "output.", "distribute.")


def load_resume_config(run_dir: Path, config_path: str | Path | None, overrides: list[str] = ()) -> Config:
    """The config to resume the run in ``run_dir`` with: its saved ``config.yaml``, or ``config_path``, plus
    ``overrides``. Only ``training.epochs`` and ``output.*`` may differ from the config the run started with.

    Raises:
        ConfigError: ``run_dir`` is not a run directory, or the config changes something the run depends on.
    """
    saved_path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        raise ConfigError("--resume", "does not exist", str(run_dir))
    if not saved_path.is_file():
        raise ConfigError("--resume", "is not an accumrun run directory (it has no config.yaml)", str(run_dir))
    saved = load_config(saved_path)
    config = load_config(config_path or saved_path, overrides)
    if config.training.subdivisions == "auto":
        # The run settled 'auto' when it started and saved the value it chose; keep that value.
        training = config.training.model_copy(update={"subdivisions": saved.training.subdivisions})
        config = config.model_copy(update={"training": training})
    changed = [
        f"{key} ({before!r} -> {after!r})"
        for key, (before, after) in _differences(saved.model_dump(mode="json"), config.model_dump(mode="json"))
        if not key.startswith(_RESUMABLE_CHANGES)
    ]
    if changed:
        raise ConfigError(
            "--resume",
            f"the config differs from the run's in {', '.join(changed)}; "
            "only training.epochs, output.* and distribute.* may change",
        )
    return config


def _differences(before: Any, after: Any, prefix: str = "") -> list[tuple[str, tuple[Any, Any]]]:
    """The dotted keys whose values differ between two nested mappings, with both values."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = list(dict.fromkeys([*before, *after]))
        return [d for k in keys for d in _differences(before.get(k), after.get(k), f"{prefix}{k}.")]
    return [] if before == after else [(prefix.rstrip("."), (before, after))]


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(str(path), "config file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(str(path), f"invalid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not a text file") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "the top level must be a mapping of sections", type(raw).__name__)
    return raw


def _apply_override(raw: dict[str, Any], override: str) -> None:
    """Set ``a.b.c=value`` in the raw mapping; the value is parsed as a YAML scalar or list."""
    key, sep, text = override.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError("--set", "expected KEY=VALUE with a dotted key such as training.subdivisions=4", override)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: depth + 1]), f"is not a section, so --set {key} cannot apply", child)
        node = child
    node[parts[-1]] = value


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe_pydantic_error(error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    section_classes = _section_classes_along(loc)
    # Tagged unions add their tag to the location; users never wrote it, so drop it.
    loc = tuple(part for i, part in enumerate(loc) if not (i > 0 and part in _UNION_TAGS.get(loc[i - 1], ())))
    path = _dotted(loc)
    if error["type"] == "extra_forbidden":
        known = list(section_classes[-1].model_fields) if section_classes else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(known)}"
        return describe(path, f"unknown key{hint}")
    if error["type"] == "missing":
        return describe(path, "required key is missing")
    message = error["msg"].removeprefix("Value error, ")
    return describe(path, message[0].lower() + message[1:], error["input"])


def _section_classes_along(loc: tuple[Any, ...]) -> list[type[BaseModel]]:
    """The schema classes that the error location passes through (its last one holds the offending key)."""
    classes: list[type[BaseModel]] = [Config]
    for i, part in enumerate(loc[:-1]):
        if loc[0] == "model" and i == 1 and part in _MODEL_SECTIONS:
            classes.append(_MODEL_SECTIONS[part])
            continue
        field = classes[-1].model_fields.get(part) if isinstance(part, str) else None
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            classes.append(annotation)
    return classes


def _cross_field_problems(config: Config) -> list[str]:
    """Rules that span several keys; the per-key rules live in the schema."""
    problems = []
    training = config.training
    if (
        isinstance(training.batch_size, int)
        and isinstance(training.subdivisions, int)
        and (training.subdivisions > training.batch_size)
    ):
        problems.append(
            describe(
                "training.subdivisions",
                f"cannot exceed training.batch_size ({training.batch_size}); each sub-batch needs a sample",
                training.subdivisions,
            )
        )
    data = config.data
    if data.name != "synthetic":
        for key in SYNTHETIC_ONLY_KEYS:
            if key in data.model_fields_set:
                problems.append(describe(f"data.{key}", "only applies to data.name: synthetic", getattr(data, key)))
    if data.name == "npz" and not data.path:
        problems.append(describe("data.path", "data.name: npz needs the path of an .npz file"))
    if data.name in ("digits", "synthetic") and data.path:
        problems.append(describe("data.path", f"is not used by data.name: {data.name}", data.path))
    model = config.model
    if isinstance(model, DarknetCnnConfig) and len(model.filters) != len(model.strides):
        problems.append(
            describe(
                "model.strides",
                f"needs one stride per entry of model.filters ({len(model.filters)})",
                model.strides,
            )
        )
    distribute = config.distribute
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
