"""``model.name: package.module:function``: a user's function that returns a Keras model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from accumrun.data.section import Keywords
from accumrun.errors import ConfigError
from accumrun.lookup import import_function, with_flags_read
from accumrun.models.kind import BuildRequest, ModelSection

if TYPE_CHECKING:
    import keras


class CustomModelConfig(ModelSection, Keywords):
    """``name: package.module:function``; every other key is passed to the function as a keyword."""

    name: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def build(config: CustomModelConfig, request: BuildRequest) -> keras.Model:
    """What the function returns for ``input_shape``, ``classes`` and the section's other keys as keywords.

    Raises:
        ConfigError: the function cannot be imported, rejects its arguments, or returns no Keras model.
    """
    import keras

    function = import_function(config.name, "model.name")
    try:
        model = function(
            input_shape=request.sample_shape,
            classes=request.outputs,
            **with_flags_read(function, config.model_extra or {}),
        )
    except TypeError as error:
        raise ConfigError("model", f"{config.name} rejected its arguments: {error}") from None
    if not isinstance(model, keras.Model):
        raise ConfigError("model.name", "the function must return a keras.Model", type(model).__name__)
    return model
