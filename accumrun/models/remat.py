"""``training.remat``: the activations that the backward pass recomputes instead of keeping, on a built model of any
kind. Remat never changes a number (:mod:`accumrun.core.recompute`): only what is held between the forward and the
backward pass, and the time.

- ``activations``: Keras' own mode, each layer's activation function recomputed (what ``keras.RematScope(mode=
  "activations")`` gives the layers made inside it, set on the layers already made);
- ``blocks``: each block, as the model's kind finds them (:mod:`accumrun.models.blocks`), run as one recomputed call,
  so that only its input is kept;
- ``layers``: every layer with weights of its own, one recomputed call each.

Applied last, to the model as it trains (after any adapters are added): a call is wrapped on the layer object, in
place, so the model, its config and ``model.keras`` are untouched, and only a training pass recomputes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
from keras.src.backend.common.remat import RematMode

from accumrun.core.recompute import recomputed, training_now
from accumrun.errors import ConfigError
from accumrun.kinds import Remat
from accumrun.models.blocks import Block
from accumrun.models.segments import Segment, run_segments_recomputed

_KERAS_ACTIVATIONS = RematMode("activations", output_size_threshold=1024, layer_names=[])
"""What ``keras.RematScope(mode="activations")`` gives the layers made inside it."""


def apply_remat(model: keras.Model, remat: Remat, find_blocks: Callable[[keras.Model], list[Block]] | None) -> str:
    """Make ``model`` recompute as ``remat`` says, in place; ``find_blocks`` is the kind's declaration of its blocks.
    Returns the startup line (empty for ``none``).

    Raises:
        ConfigError: ``blocks`` on a model where none are found; a recomputed layer with an activity regularizer (its
            loss would be computed inside the recomputation, where no gradient reaches it).
    """
    if remat is Remat.NONE:
        return ""
    if remat is Remat.ACTIVATIONS:
        layers = [layer for layer in _layers(model) if getattr(layer, "activation", None) is not None]
        for layer in layers:
            layer._remat_mode = _KERAS_ACTIVATIONS
        return f"remat: activations: the activation functions of {len(layers)} layers recomputed (Keras' mode)"
    if remat is Remat.LAYERS:
        layers = [layer for layer in _layers(model) if _own_weights(layer)]
        for layer in layers:
            _recompute_layer(layer, remat)
        return f"remat: layers: {len(layers)} layers with weights recomputed in the backward pass"
    blocks = find_blocks(model) if find_blocks is not None else []
    if not blocks:
        raise ConfigError("training.remat", f"blocks: {model.name} has no blocks to recompute; use layers", "blocks")
    segments: dict[int, list[Segment]] = {}
    for block in blocks:
        if isinstance(block, Segment):
            segments.setdefault(id(block.graph), []).append(block)
        else:
            _recompute_layer(block, remat)
    for group in segments.values():
        _refuse_activity_regularizers([layer for s in group for layer in s.layers], remat)
        run_segments_recomputed(group[0].graph, group)
    return f"remat: blocks: {len(blocks)} blocks recomputed; activations kept at their boundaries"


def _layers(model: keras.Model) -> list[keras.layers.Layer]:
    return list(model._flatten_layers(include_self=False, recursive=True))


def _own_weights(layer: keras.layers.Layer) -> bool:
    """Whether ``layer`` holds weights itself, not only through the layers inside it."""
    inner = {id(w) for sub in layer._flatten_layers(include_self=False, recursive=True) for w in sub.weights}
    return any(id(w) not in inner for w in layer.weights)


def _recompute_layer(layer: keras.layers.Layer, remat: Remat) -> None:
    """Wrap ``layer``'s call (its quantized call when it is quantized, which Keras calls instead)."""
    _refuse_activity_regularizers([layer], remat)
    name = "quantized_call" if getattr(layer, "quantization_mode", None) is not None else "call"
    original = getattr(layer, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        if not training_now():
            return original(*args, **kwargs)
        return recomputed(original, args, kwargs, [layer])

    setattr(layer, name, call)


def _refuse_activity_regularizers(layers: list[keras.layers.Layer], remat: Remat) -> None:
    inside = [
        sub
        for layer in layers
        for sub in layer._flatten_layers(include_self=True, recursive=True)
        if getattr(sub, "activity_regularizer", None) is not None
    ]
    if inside:
        raise ConfigError(
            "training.remat",
            f"cannot recompute {inside[0].name}: its activity regularizer's loss would get no gradient",
            str(remat),
        )
