"""``training.precision: float64``: what a run builds in float64, and what it refuses of a model.

Keras makes a variable in its ``floatx`` unless told otherwise: the optimizer's slots and learning rate, the
metrics' state and BatchNorm's records. So a float64 run builds under :func:`floats` (floatx and the dtype policy
float64, restored after: both are global in Keras); the step sums in its objective's dtype
(:attr:`~accumrun.core.losses.Objective.dtype`), and the data is read in float64
(:func:`~accumrun.data.dataset.sample_floats`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras

from accumrun.errors import ConfigError
from accumrun.kinds import Precision


@contextlib.contextmanager
def floats(precision: Precision) -> Iterator[None]:
    """Keras' floatx and dtype policy float64 inside, under ``float64``; as they were outside. Nothing changes for
    the others."""
    if precision is not Precision.FLOAT64:
        yield
        return
    floatx, policy = keras.config.floatx(), keras.mixed_precision.dtype_policy()
    keras.config.set_floatx("float64")
    keras.mixed_precision.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.mixed_precision.set_dtype_policy(policy)


def float64_problem(model: keras.Model) -> tuple[str, str, str] | None:
    """Under ``float64``, a layer that computes in another dtype, or a variable held in one (a saved model built
    under mixed precision, a constructor's own ``dtype``): float64 and mixed precision are one run's two precisions,
    refused together, as the key to blame, what is wrong and the value given; None where all is float64."""
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False)
        # An input holds the raw samples' dtype (uint8 images); a nested model's own policy computes nothing.
        if not isinstance(layer, keras.layers.InputLayer | keras.Model)
    ]
    # A mixed policy first: it is the precision that float64 would fight.
    layers.sort(key=lambda layer: layer.dtype_policy.compute_dtype == layer.dtype_policy.variable_dtype)
    for layer in layers:
        policy = layer.dtype_policy
        variables = [v for v in layer.weights if v.dtype != "float64" and "float" in str(v.dtype)]
        if policy.compute_dtype != "float64" or variables:
            held = policy.name if policy.compute_dtype != "float64" else str(variables[0].dtype)
            message = (
                f"float64 cannot run with the model's own precision: layer '{layer.name}' computes or holds "
                f"{held}; build the model without a dtype of its own, or use float32 or mixed precision alone"
            )
            return "training.precision", message, "float64"
    return None


def check_float64(model: keras.Model, precision: Precision) -> None:
    """Refuse, under ``float64``, a model with another precision of its own (:func:`float64_problem`)."""
    problem = float64_problem(model) if precision is Precision.FLOAT64 else None
    if problem is not None:
        raise ConfigError(*problem)
