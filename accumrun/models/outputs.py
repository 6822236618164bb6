"""What a model's output is: logits or probabilities (its last activation), and whether its shape fits the
targets. Both are settled before the first step, so a mismatch is a clear error rather than a wrong loss."""

from __future__ import annotations

from typing import Any

import keras

from accumrun.errors import ConfigError
from accumrun.kinds import Task

PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")


def output_activation(model: keras.Model) -> str | None:
    """``softmax`` or ``sigmoid`` when the model's output comes out of one (an output layer's ``activation``, an
    ``Activation`` or ``Softmax`` layer, or such a layer at the end of a nested model), else None: logits, or a
    model whose last operation cannot be read."""
    layer = _output_layer(model)
    while isinstance(layer, keras.Model):
        layer = _output_layer(layer)
    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    name = getattr(getattr(layer, "activation", None), "__name__", None)
    return name if name in PROBABILITY_ACTIVATIONS else None


def _output_layer(model: keras.Model) -> Any:
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):  # a subclassed model has no graph of layers to read
        return None
    if not outputs or len(outputs) != 1:
        return None
    history = getattr(outputs[0], "_keras_history", None)
    return history[0] if history else (model.layers[-1] if model.layers else None)


def check_output_shape(
    model: keras.Model, task: Task, target_shape: tuple[int, ...], classes: int | None, sparse_loss: bool
) -> int:
    """Refuse a model whose output cannot hold the targets; return the output's width.

    Class labels need one output per class (one sigmoid unit also serves two classes, with a loss that takes
    0/1 targets); a binary task needs that one unit; a language model one output per token id at every position;
    multi-label and regression targets of shape ``(k,)`` need an output of shape ``(k,)``.

    Raises:
        ConfigError: the output is not a single tensor of one axis per sample, or its width does not fit.
    """
    shape = model.output_shape
    if isinstance(shape, list) or len(shape) < 2:
        raise ConfigError("model", f"accumrun trains models with one output tensor; this one has {shape}")
    output = tuple(shape[1:])
    if task is Task.BINARY:
        if output != (1,):
            raise ConfigError(
                "model",
                f"a binary task needs one output unit (the probability of class 1); the model outputs {output} "
                "(for one unit per class set data.task: classification)",
            )
        return 1
    if task is Task.CAUSAL_LM:
        # A model of any sequence length (bucketed padding) has no fixed length to compare.
        if output not in ((*target_shape, classes), (None, classes)):
            raise ConfigError(
                "model",
                f"a language model needs an output of shape {(*target_shape, classes)}: the logits of each of the "
                f"{classes} token ids at every position; the model outputs {output}",
            )
        return int(output[-1])
    if task is Task.CLASSIFICATION:
        width = output[-1]
        binary_unit = width == 1 and classes == 2 and not sparse_loss
        if len(output) != 1 or width is None or (width < (classes or 0) and not binary_unit):
            raise ConfigError(
                "model",
                f"class labels 0..{(classes or 1) - 1} need an output of shape ({classes},), one unit per class; "
                f"the model outputs {output} (change the model's classes or head, or data.task)",
            )
        return int(width)
    if output != target_shape:
        raise ConfigError(
            "model",
            f"{task.value.replace('_', '-')} targets of shape {target_shape} need an output of shape {target_shape}; "
            f"the model outputs {output} (change the model's output units, or data.task)",
        )
    return int(output[-1]) if output else 1
