"""Building the configured model: the kind its section belongs to (:data:`accumrun.models.registry.MODELS`) builds
it."""

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
        ConfigError: a model cannot be found, built or loaded as configured (see each kind's build).
    """
    request = BuildRequest(sample_shape, outputs, vocabulary_size, per_position, any_length)
    return kind_of(config).build(config, request)
