"""What ``training.precision`` refuses of the rest of the config (the precision itself is set in
:mod:`accumrun.training.setup`, which scales the loss under ``mixed_float16``). The key is one value, so float64 and
mixed precision meet only in a model with a precision of its own (a saved model built under mixed precision),
which :mod:`accumrun.models.floats` refuses once the model is built."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from accumrun.kinds import Precision, Strategy
from accumrun.sections import Problem


def precision_problems(
    precision: Precision, strategy: Literal["auto"] | Strategy, quantize: str | None
) -> Iterator[Problem]:
    """``mixed_float16`` on any strategy but ``none``, or over an int8 base (``model.quantize``)."""
    if precision == Precision.MIXED_FLOAT16 and strategy != Strategy.NONE:
        # The replicated step does not scale the loss; float16 gradients would underflow unnoticed.
        message = "mixed_float16 (loss scaling) runs on one device only; use mixed_bfloat16 with distribute"
        yield "training.precision", message, "mixed_float16"
    if precision == Precision.MIXED_FLOAT16 and quantize is not None:
        # Keras' quantize() raises for a float16 compute dtype; said here, before any model is built.
        message = f"Keras' {quantize} layers do not compute in float16; use mixed_bfloat16 with model.quantize"
        yield "training.precision", message, "mixed_float16"
