"""``model.name: darknet_cnn`` (the default): the network of the original subdivisions experiment."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from accumrun.errors import DataError
from accumrun.models.dtypes import logits_dtype
from accumrun.models.kind import BuildRequest, ModelSection
from accumrun.sections import Section

if TYPE_CHECKING:
    import keras


class DarknetCnnConfig(ModelSection, Section):
    name: Literal["darknet_cnn"] = "darknet_cnn"
    filters: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [32, 64, 96], min_length=1)
    strides: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [2, 2, 1], min_length=1)
    leaky_alpha: float = Field(0.1, ge=0)

    def broken_rules(self) -> Iterator[tuple[str, str, Any]]:
        if len(self.filters) != len(self.strides):
            yield "model.strides", f"needs one stride per entry of model.filters ({len(self.filters)})", self.strides


def build(config: DarknetCnnConfig, request: BuildRequest) -> keras.Model:
    """The network ``config`` describes, for the samples and outputs of ``request``."""
    return darknet_cnn(request.sample_shape, request.outputs, config.filters, config.strides, config.leaky_alpha)


def darknet_cnn(
    sample_shape: tuple[int, ...],
    outputs: int,
    filters: list[int],
    strides: list[int],
    leaky_alpha: float = 0.1,
) -> keras.Model:
    """The network of the original subdivisions experiment.

    Blocks of 3x3 Conv2D (no bias: BatchNorm's offset replaces it) + BatchNorm + leaky ReLU, then global mean
    pooling and a Dense layer with ``outputs`` logits.

    Raises:
        DataError: the samples are not images (for example flat vectors).
    """
    import keras

    if len(sample_shape) != 3:
        raise DataError(
            "data", "darknet_cnn needs image samples of shape (height, width, channels)", tuple(sample_shape)
        )
    inputs = keras.Input(shape=sample_shape)
    x = inputs
    for width, stride in zip(filters, strides, strict=True):
        x = keras.layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.LeakyReLU(negative_slope=leaky_alpha)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    # Logits stay float32 under a mixed-precision policy, so the softmax and the loss do too.
    logits = keras.layers.Dense(outputs, dtype=logits_dtype())(x)
    return keras.Model(inputs, logits, name="darknet_cnn")
