"""Building the configured model: the kind its section belongs to (:data:`accumrun.models.registry.MODELS`) builds
it, and ``model.lora`` (with ``quantize`` and ``adapters``) adapts it (:mod:`accumrun.models.lora`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accumrun.models.kind import BuildRequest
from accumrun.models.registry import kind_of

if TYPE_CHECKING:
    import keras


def build_model(
    config: Any,
    sample_shape: tuple[int, ...],
    outputs: int,
    vocabulary_size: int | None = None,
    *,
    per_position: bool = False,
    any_length: bool = False,
) -> keras.Model:
    """Build the configured model for samples of ``sample_shape`` and ``outputs`` outputs (the other arguments as
    :class:`~accumrun.models.kind.BuildRequest` describes them). The built-ins and new heads output logits.

    Raises:
        DataError: the samples do not fit the model (for example flat vectors into a CNN).
        ConfigError: a model cannot be found, built or loaded as configured (see each kind's build), or adapted as
            ``model.lora`` says (see :func:`~accumrun.models.lora.adapt` and
            :func:`~accumrun.models.adapters.load_adapters`).
    """
    request = BuildRequest(sample_shape, outputs, vocabulary_size, per_position, any_length)
    kind = kind_of(config)
    model = kind.build(config, request)
    if config.lora is None:
        return model
    from accumrun.models.adapters import load_adapters
    from accumrun.models.lora import adapt

    model = adapt(model, config, attention=kind.attention)
    if config.adapters is not None:
        load_adapters(model, config.adapters)
    return model
