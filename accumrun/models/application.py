"""``model.name: keras.applications.<Constructor>``: a Keras application, by default with a new head for the task."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from accumrun.data.section import Keywords
from accumrun.errors import ConfigError
from accumrun.lookup import checked_keywords, find, normalized
from accumrun.models.dtypes import logits_dtype
from accumrun.models.kind import BuildRequest, ModelSection
from accumrun.sections import Flag

if TYPE_CHECKING:
    import keras

APPLICATION_PREFIX = "keras.applications."


class ApplicationConfig(ModelSection, Keywords):
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

    def broken_rules(self) -> Iterator[tuple[str, str, Any]]:
        if self.freeze_base and self.include_top:
            yield "model.freeze_base", "trains a new head on a frozen base; it needs include_top: false", True


def build(config: ApplicationConfig, request: BuildRequest) -> keras.Model:
    """A ``keras.applications`` model for samples of ``request.sample_shape``.

    Without ``include_top`` (the default) the base ends in ``pooling`` and gets a new head of ``outputs``
    logits; ``freeze_base`` then trains the head alone. With ``include_top`` the application keeps its own
    classifier (sized to ``outputs`` unless ``classes`` is given; a sigmoid for one unit), whose softmax or
    sigmoid the loss then detects.

    Raises:
        ConfigError: an unknown application, an input shape it rejects (its message names the minimum), weights
            that cannot be loaded, or a keyword it does not take.
    """
    import keras

    sample_shape, outputs = request.sample_shape, request.outputs
    constructors = {normalized(name): value for name, value in vars(keras.applications).items() if callable(value)}
    constructor = find(constructors, config.constructor, "model.name", "keras application")
    keywords = config.keywords
    keywords = checked_keywords(constructor, keywords, "model", config.name)
    weights_file = config.weights if config.weights not in (None, "imagenet") else None
    if weights_file is not None and not Path(weights_file).is_file():
        raise ConfigError("model.weights", "weights file not found", weights_file)
    if config.include_top:
        keywords.setdefault("classes", outputs)
        if keywords["classes"] == 1 and "classifier_activation" in inspect.signature(constructor).parameters:
            # A softmax over one unit is always 1: a binary task's one unit is the sigmoid's probability.
            keywords.setdefault("classifier_activation", "sigmoid")
    else:
        keywords["pooling"] = config.pooling
    try:
        with warnings.catch_warnings():
            # Keras warns that an input size it has no weights for gets its default size's (224x224) weights;
            # the startup summary states the input shape, and the README says which weights load.
            warnings.filterwarnings("ignore", message=".*input_shape. is undefined or non-square", category=UserWarning)
            base = constructor(
                input_shape=sample_shape,
                include_top=config.include_top,
                weights="imagenet" if config.weights == "imagenet" else None,
                **keywords,
            )
        if weights_file is not None:
            base.load_weights(weights_file)
    except (ValueError, OSError) as error:
        message = " ".join(str(error).split())
        raise ConfigError("model", f"{config.constructor} refused input shape {sample_shape}: {message}") from None
    except Exception as error:
        # Keras' get_file raises a bare Exception("URL fetch failure on ...") when it cannot download.
        if config.weights != "imagenet" or "fetch failure" not in str(error):
            raise
        raise ConfigError(
            "model.weights",
            "could not download the imagenet weights (no network?); use weights: null to train from scratch, "
            "or the path of a weights file you have",
            config.weights,
        ) from None
    if config.include_top:
        return base
    if config.freeze_base:
        # Frozen layers also run in inference mode (BatchNorm uses its moving statistics), as Keras fine-tuning does.
        base.trainable = False
    # Logits stay float32 under a mixed-precision policy, so the softmax and the loss do too.
    head = keras.layers.Dense(outputs, dtype=logits_dtype(), name="head")(base.output)
    return keras.Model(base.input, head, name=f"{base.name}_head")


def preprocessing(config: ApplicationConfig) -> Callable[[Any], Any] | None:
    """The ``preprocess_input`` of a pretrained application (the module that defines its constructor), which
    ``rescale: auto`` applies to its raw 0..255 inputs; None without pretrained weights."""
    if config.weights is None:
        return None
    import keras

    for module in vars(keras.applications).values():
        if isinstance(module, ModuleType) and _defines(module, config.constructor):
            return getattr(module, "preprocess_input", None)
    return None


def _defines(module: ModuleType, constructor: str) -> bool:
    return any(normalized(name) == normalized(constructor) for name in vars(module))
