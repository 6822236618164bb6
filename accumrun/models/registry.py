"""The kinds of model, registered once: for each, its config section, how a ``model.name`` selects it, its build and
what it declares.

The config's ``model`` union, :func:`accumrun.models.builders.build_model` and the training setup read this table.
A name selects the first kind in the table whose naming takes it, so ``package.module:function`` comes last. No
module here imports TensorFlow, so loading a config stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accumrun.errors import ConfigError
from accumrun.models import application, darknet_cnn, factory, hub, mlp, saved, transformer_kind
from accumrun.models.kind import ModelKind, ModelSection, Naming, exactly, prefixed


def _blocks(finder: str) -> Callable[[Any], list[Any]]:
    """A finder of :mod:`accumrun.models.blocks`, imported when called (it imports Keras)."""

    def find(model: Any) -> list[Any]:
        from accumrun.models import blocks

        found: list[Any] = getattr(blocks, finder)(model)
        return found

    return find


MODELS: dict[str, ModelKind[Any]] = {
    "darknet_cnn": ModelKind(darknet_cnn.DarknetCnnConfig, exactly("darknet_cnn"), darknet_cnn.build),
    "mlp": ModelKind(mlp.MlpConfig, exactly("mlp"), mlp.build),
    "transformer": ModelKind(
        transformer_kind.TransformerConfig,
        exactly("transformer"),
        transformer_kind.build,
        token_ids=True,
        attention=True,
        blocks=_blocks("transformer_blocks"),
    ),
    "application": ModelKind(
        application.ApplicationConfig,
        prefixed(application.APPLICATION_PREFIX, "keras.applications.<Name>"),
        application.build,
        preprocessing=application.preprocessing,
        blocks=_blocks("residual_blocks"),
    ),
    "keras_hub": ModelKind(
        hub.KerasHubConfig,
        prefixed(hub.KERAS_HUB_PREFIX, "keras_hub.models.<Name>Backbone"),
        hub.build,
        token_ids=True,
        attention=None,
        blocks=_blocks("hub_blocks"),
    ),
    "saved": ModelKind(
        saved.SavedModelConfig, exactly("saved"), saved.build, attention=None, blocks=_blocks("any_blocks")
    ),
    # Any name with a colon: a malformed one is then refused by the section's pattern, not as an unknown model.
    "custom": ModelKind(
        factory.CustomModelConfig,
        Naming("'package.module:function'", lambda name: ":" in name),
        factory.build,
        attention=None,
        blocks=_blocks("any_blocks"),
    ),
}
"""Every kind of model by its tag in the config's union, in the order the refusal of an unknown name lists them."""

DEFAULT_MODEL = "darknet_cnn"
"""The kind of a ``model`` section without a ``name``."""

MODEL_SECTIONS: dict[str, type[ModelSection]] = {tag: kind.section for tag, kind in MODELS.items()}
"""Every kind's section by its tag: the config's ``model`` union is built from it."""

_SHOWN = [kind.naming.shown for kind in MODELS.values()]
UNKNOWN_MODEL = f"unknown model; use {', '.join(_SHOWN[:-1])} or {_SHOWN[-1]}"
"""The refusal of a ``model.name`` that no kind takes."""

_BY_SECTION = {kind.section: kind for kind in MODELS.values()}


def model_tag(value: Any) -> str:
    """The tag of the kind that a ``model`` mapping (or section) names: ``unknown`` for a name no kind takes."""
    name = value.get("name", DEFAULT_MODEL) if isinstance(value, dict) else getattr(value, "name", None)
    if not isinstance(name, str):
        return "unknown"
    return next((tag for tag, kind in MODELS.items() if kind.naming.selects(name)), "unknown")


def kind_of(section: Any) -> ModelKind[Any]:
    """The kind whose section ``section`` is.

    Raises:
        ConfigError: ``section`` is no kind's section.
    """
    kind = _BY_SECTION.get(type(section))
    if kind is None:
        raise ConfigError("model.name", "unknown model", getattr(section, "name", section))
    return kind
