"""The blocks of a built model, as its kind declares them (:attr:`accumrun.models.kind.ModelKind.blocks`), for
``training.remat: blocks`` to recompute: layers that are blocks of their own (KerasHub's transformer layers), or
:class:`~accumrun.models.segments.Segment` s of a functional graph (the built-in transformer's blocks, residual
blocks of Keras applications)."""

from __future__ import annotations

import re
from typing import Any, TypeAlias

import keras

from accumrun.models.segments import Segment, ordered_nodes, segment

Block: TypeAlias = keras.layers.Layer | Segment
"""One block: a layer recomputed whole, or a segment of a graph."""

_BUILT_IN_BLOCK = re.compile(r"attention_norm_(\d+)")
_HUB_BLOCK_CLASSES = {"TransformerDecoder", "TransformerEncoder"}


def transformer_blocks(model: keras.Model) -> list[Block]:
    """The built-in transformer's blocks: from each block's input (its first norm's) to the next one's, the last to
    the final norm's input."""
    for graph in _graphs(model):
        starts = {int(m.group(1)): layer for layer in graph.layers if (m := _BUILT_IN_BLOCK.fullmatch(layer.name))}
        final = next((layer for layer in graph.layers if layer.name == "final_norm"), None)
        if not starts or final is None:
            continue
        bounds = [starts[i].input for i in sorted(starts)] + [final.input]
        found = [segment(graph, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
        return [s for s in found if s is not None]
    return []


def hub_blocks(model: keras.Model) -> list[Block]:
    """A KerasHub backbone's transformer layers: its ``transformer_layers``, or layers whose class is (or derives
    from) KerasHub's ``TransformerDecoder`` or ``TransformerEncoder``."""
    listed = [layer for m in _graphs(model) for layer in getattr(m, "transformer_layers", None) or []]
    if listed:
        return list(listed)
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if _HUB_BLOCK_CLASSES & {cls.__name__ for cls in type(layer).__mro__}
    ]


def residual_blocks(model: keras.Model) -> list[Block]:
    """Residual blocks: each ``Add`` layer of two branches, from where the branches part to the sum."""
    blocks: list[Block] = []
    for graph in _graphs(model):
        nodes = ordered_nodes(graph)
        for node in nodes:
            if isinstance(node.operation, keras.layers.Add) and len(node.input_tensors) == 2:
                start = _parting(nodes, *node.input_tensors)
                found = segment(graph, start, node.outputs[0]) if start is not None else None
                if found is not None:
                    blocks.append(found)
    return blocks


def any_blocks(model: keras.Model) -> list[Block]:
    """The blocks of a model of any kind (saved, or made by a function): KerasHub's transformer layers, the built-in
    transformer's blocks, or residual blocks, the first kind found."""
    for find in (hub_blocks, transformer_blocks, residual_blocks):
        found = find(model)
        if found:
            return found
    return []


def _graphs(model: keras.Model) -> list[keras.Model]:
    """``model`` and the functional models inside it."""
    return [
        layer
        for layer in model._flatten_layers(include_self=True, recursive=True)
        if isinstance(layer, keras.Model) and hasattr(layer, "_nodes_by_depth")
    ]


def _parting(nodes: list[Any], a: Any, b: Any) -> Any | None:
    """The latest tensor that both ``a`` and ``b`` depend on (one of them, for a skip connection)."""
    made_at = {id(x): place for place, node in enumerate(nodes) for x in node.outputs}
    of_b = {id(x) for x in _ancestors(nodes, b)}
    common = [x for x in _ancestors(nodes, a) if id(x) in of_b]
    return max(common, key=lambda x: made_at.get(id(x), -1), default=None)


def _ancestors(nodes: list[Any], tensor: Any) -> list[Any]:
    """``tensor`` and the tensors it depends on."""
    found, wanted = [tensor], {id(tensor)}
    for node in reversed(nodes):
        if any(id(x) in wanted for x in node.outputs):
            for x in node.input_tensors:
                if id(x) not in wanted:
                    wanted.add(id(x))
                    found.append(x)
    return found
