"""``model.name: transformer``: the built-in Transformer encoder over token ids (its layers are in
:mod:`accumrun.models.transformer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from accumrun.models.kind import BuildRequest, ModelSection
from accumrun.sections import Flag, Section

if TYPE_CHECKING:
    import keras


class TransformerConfig(ModelSection, Section):
    """``name: transformer``: a Transformer encoder over token ids, pooled over the real tokens into logits."""

    trained_before_key: ClassVar[dict[str, Any]] = {"attention_bias": True}

    name: Literal["transformer"]
    layers: int = Field(2, ge=1)
    heads: int = Field(2, ge=1)
    width: int = Field(64, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    attention_bias: Flag = False
    """Biases in the attention's projections. Off, as in most current transformers: the key's bias has a true
    gradient of exactly 0 (the softmax ignores it), and Adam would turn float noise there into steps. A run's
    config.yaml records it; one without it, from before the key, had them, and resumes with them."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerConfig:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads ({self.heads})")
        return self


def build(config: TransformerConfig, request: BuildRequest) -> keras.Model:
    """The encoder ``config`` describes, causally masked for a language model (``request.per_position``)."""
    from accumrun.models.transformer import transformer

    return transformer(
        request.sample_shape,
        request.outputs,
        request.vocabulary_size,
        layers=config.layers,
        heads=config.heads,
        width=config.width,
        dropout=config.dropout,
        causal=request.per_position,
        any_length=request.any_length,
        attention_bias=config.attention_bias,
    )
