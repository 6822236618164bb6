"""KerasHub backbones as a run's model: ``model.name: keras_hub.models.<Name>Backbone``, built from its constructor
keys (randomly initialized) or loaded from a local ``preset`` folder, then given a head for the task.

accumrun feeds a backbone token ids and their padding mask (id 0 pads), and a segment id of 0 for each token
where the backbone takes one (BERT). A language model (``task: causal_lm``) needs a backbone that is causal (one
that KerasHub pairs with a ``CausalLM`` task, such as GPT-2 or Llama) and gets a Dense head of the next token's
logits at every position; a classifier gets the mean of the backbone's outputs over the real tokens, then a Dense
head, so padding changes nothing. KerasHub is the ``text`` extra (``pip install 'accumrun[text]'``); nothing is
downloaded: a preset is a folder that ``save_to_preset`` wrote.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from accumrun.data.section import Keywords
from accumrun.errors import ConfigError
from accumrun.lookup import checked_keywords, find, import_keras_hub, normalized
from accumrun.models.dtypes import logits_dtype
from accumrun.models.kind import BuildRequest, ModelSection

if TYPE_CHECKING:
    import keras

KERAS_HUB_PREFIX = "keras_hub.models."
_FED = {"token_ids", "padding_mask", "segment_ids"}


class KerasHubConfig(ModelSection, Keywords):
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


def build(config: KerasHubConfig, request: BuildRequest) -> keras.Model:
    """The backbone with a head, for what ``request`` asks (see :func:`keras_hub_model`)."""
    return keras_hub_model(
        config,
        request.sample_shape,
        request.outputs,
        request.vocabulary_size,
        per_position=request.per_position,
        any_length=request.any_length,
    )


def keras_hub_model(
    config: KerasHubConfig,
    sample_shape: tuple[int, ...],
    outputs: int,
    vocabulary_size: int | None,
    *,
    per_position: bool,
    any_length: bool,
) -> keras.Model:
    """The backbone ``config`` names, fed token ids of ``sample_shape`` (any length with ``any_length``), with a
    head of ``outputs`` logits: at every position (``per_position``, a language model) or from the mean over the
    real tokens.

    Raises:
        ConfigError: KerasHub is missing, the name is not a backbone, a key it does not take, a preset folder that
            is missing or holds no backbone, a vocabulary smaller than the tokenizer's, inputs accumrun cannot feed,
            or a backbone that is not causal for a language model.
    """
    import keras

    keras_hub = import_keras_hub("model.name")
    if vocabulary_size is None or len(sample_shape) != 1:
        raise ConfigError("model.name", f"{config.name} reads token ids: use a text source")
    backbones = {
        normalized(name): value
        for name, value in vars(keras_hub.models).items()
        if inspect.isclass(value) and issubclass(value, keras_hub.models.Backbone)
    }
    backbone_class = find(backbones, config.constructor, "model.name", "KerasHub backbone")
    backbone = _backbone(backbone_class, config, sample_shape[0], vocabulary_size)
    fed = set(backbone.input) if isinstance(backbone.input, dict) else set()
    if not fed or not fed <= _FED or "token_ids" not in fed:
        raise ConfigError(
            "model.name",
            f"{config.name} takes inputs {sorted(fed) or backbone.input}; accumrun feeds "
            "token_ids, padding_mask and segment_ids",
            config.name,
        )
    if per_position and backbone_class.__name__ not in _causal_backbones(keras_hub):
        raise ConfigError(
            "model.name",
            f"{config.name} is not causal (each position sees the tokens after it); a language model needs a "
            "decoder such as keras_hub.models.GPT2Backbone",
            config.name,
        )
    ids = keras.Input(shape=(None if any_length else sample_shape[0],), dtype="int32", name="token_ids")
    real = keras.ops.not_equal(ids, 0)
    inputs = {"token_ids": ids, "padding_mask": real}
    if "segment_ids" in fed:
        inputs["segment_ids"] = keras.ops.zeros_like(ids)
    hidden = backbone(inputs)
    if isinstance(hidden, dict):
        hidden = hidden["sequence_output"]
    if per_position:
        return keras.Model(
            ids, keras.layers.Dense(outputs, dtype=logits_dtype(), name="head")(hidden), name=config.name
        )
    weights = keras.ops.cast(real, hidden.dtype)[:, :, None]
    pooled = keras.ops.sum(hidden * weights, axis=1) / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)
    return keras.Model(ids, keras.layers.Dense(outputs, dtype=logits_dtype(), name="head")(pooled), name=config.name)


def _backbone(backbone_class: Any, config: KerasHubConfig, length: int, vocabulary_size: int) -> Any:
    """The backbone from its preset folder, or built from the constructor keys (the vocabulary and the longest
    sequence default to the tokenizer's and ``sequence_length``)."""
    if config.preset is not None:
        folder = Path(config.preset)
        if not (folder / "config.json").is_file():
            where = "folder not found" if not folder.is_dir() else "holds no KerasHub preset (config.json)"
            raise ConfigError("model.preset", where, config.preset)
        try:
            backbone = backbone_class.from_preset(str(folder))
        except (ValueError, OSError, TypeError) as error:
            raise ConfigError("model.preset", f"cannot be loaded: {' '.join(str(error).split())}") from None
    else:
        given = checked_keywords(backbone_class, config.keywords, "model", config.name)
        parameters = inspect.signature(backbone_class).parameters
        defaults = {"vocabulary_size": vocabulary_size, "max_sequence_length": length}
        keywords = {**{k: v for k, v in defaults.items() if k in parameters}, **given}
        try:
            backbone = backbone_class(**keywords)
        except (TypeError, ValueError) as error:
            raise ConfigError("model", f"{config.name} rejected the settings: {error}") from None
    size = getattr(backbone, "vocabulary_size", None)
    if size is not None and size < vocabulary_size:
        raise ConfigError(
            "model", f"{config.name} has a vocabulary of {size:,} ids; the tokenizer has {vocabulary_size:,}", size
        )
    return backbone


def _causal_backbones(keras_hub: Any) -> set[str]:
    """The backbones that KerasHub pairs with a causal language model task."""
    tasks: list[Any] = [value for value in vars(keras_hub.models).values() if inspect.isclass(value)]
    return {
        task.backbone_cls.__name__
        for task in tasks
        if issubclass(task, keras_hub.models.CausalLM) and getattr(task, "backbone_cls", None) is not None
    }
