"""``model.name: saved``: a model a user saved with Keras, trained as it is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from accumrun.errors import ConfigError
from accumrun.models.kind import BuildRequest, ModelSection
from accumrun.sections import Section

if TYPE_CHECKING:
    import keras


class SavedModelConfig(ModelSection, Section):
    """``name: saved``: a model a user saved with Keras (``.keras`` or ``.h5``), trained as it is."""

    name: Literal["saved"]
    path: str


def build(config: SavedModelConfig, request: BuildRequest) -> keras.Model:
    """The saved model; its input must take samples of ``request.sample_shape``.

    Raises:
        ConfigError: the file is missing, is not a Keras model, or takes inputs of another shape.
    """
    import keras

    sample_shape = request.sample_shape
    path = Path(config.path)
    if not path.is_file():
        raise ConfigError("model.path", "saved model not found", config.path)
    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as error:  # a file of any kind, or a model whose custom layers are not importable
        message = " ".join(str(error).split())[:300]
        raise ConfigError("model.path", f"cannot load as a Keras model: {message}", config.path) from None
    if not isinstance(model, keras.Model):
        raise ConfigError("model.path", "does not hold a Keras model", config.path)
    expected = model.input_shape
    fits = (
        not isinstance(expected, list)
        and len(expected) == len(sample_shape) + 1
        and all(e in (None, s) for e, s in zip(expected[1:], sample_shape, strict=True))
    )
    if not fits:
        raise ConfigError(
            "model.path",
            f"the model takes inputs of shape {_shape(expected)}, the data's samples have shape {sample_shape}",
            config.path,
        )
    return model


def _shape(shape: Any) -> Any:
    """A Keras input shape without its batch axis, as a user would write it."""
    return tuple(shape[1:]) if isinstance(shape, tuple) else shape
