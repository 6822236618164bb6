"""Segments: a stretch of a functional model's graph, from one tensor to a later one, run as one recomputed call.

A block that is no layer of its own (the built-in transformer's, a Keras application's residual block) is the nodes
between its input and its output: those that depend on the input and that the output depends on. It is run as one
call of :func:`accumrun.core.recompute.recomputed`, so only its boundary is kept for the backward pass. Tensors it
reads from outside (an attention mask) come in as arguments. A stretch is a block only when nothing outside reads
what happens inside it: then running it whole at its last node runs the graph as Keras does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
from keras import tree

from accumrun.core.recompute import recomputed, training_now


@dataclass(frozen=True)
class Segment:
    """The nodes of ``graph`` from ``start`` to ``end`` (in the order they run), and the tensors they read from
    outside, ``start`` among them."""

    graph: keras.Model
    nodes: tuple[Any, ...]
    inputs: tuple[Any, ...]
    end: Any

    @property
    def layers(self) -> list[keras.layers.Layer]:
        """The layers its nodes call."""
        return [node.operation for node in self.nodes if isinstance(node.operation, keras.layers.Layer)]


def ordered_nodes(graph: keras.Model) -> list[Any]:
    """The nodes of a functional ``graph`` in the order it runs them (deepest first), inputs left out."""
    return [
        node
        for depth in sorted(graph._nodes_by_depth, reverse=True)
        for node in graph._nodes_by_depth[depth]
        if node.operation is not None and not node.is_input
    ]


def segment(graph: keras.Model, start: Any, end: Any) -> Segment | None:
    """The segment of ``graph`` from tensor ``start`` to tensor ``end``; None where there is none, or where a tensor
    inside it is read outside it (or is an output of the graph)."""
    nodes = ordered_nodes(graph)
    dependent = {id(start)}
    for node in nodes:
        if any(id(x) in dependent for x in node.input_tensors):
            dependent.update(id(x) for x in node.outputs)
    needed, inside = {id(end)}, []
    for node in reversed(nodes):
        if any(id(x) in needed for x in node.outputs) and id(node.outputs[0]) in dependent:
            inside.append(node)
            needed.update(id(x) for x in node.input_tensors if x is not start)
    inside.reverse()
    if not inside or all(x is not end for x in inside[-1].outputs):
        return None
    made = {id(x) for node in inside for x in node.outputs}
    read_outside = {id(x) for node in nodes if node not in inside for x in node.input_tensors}
    read_outside |= {id(x) for x in graph.outputs}
    if (made - {id(end)}) & read_outside:
        return None
    inputs = {id(x): x for node in inside for x in node.input_tensors if id(x) not in made}
    return Segment(graph, tuple(inside), tuple(inputs.values()), end)


def run_segments_recomputed(graph: keras.Model, segments: list[Segment]) -> None:
    """Have ``graph`` run each of ``segments`` (its own) as one recomputed call while it trains."""
    original = graph.__dict__.get("_run_through_graph", graph._run_through_graph)
    last = {id(s.nodes[-1]): s for s in segments}
    inside = {id(node) for s in segments for node in s.nodes}

    def run_through_graph(inputs: Any, operation_fn: Callable[..., Any] = lambda op: op, call_fn: Any = None) -> Any:
        if call_fn is not None or not training_now():
            return original(inputs, operation_fn=operation_fn, call_fn=call_fn)
        values = {id(x): y for x, y in zip(graph.inputs, tree.flatten(inputs), strict=True)}
        for node in ordered_nodes(graph):
            if id(node) in last:
                values[id(last[id(node)].end)] = _run_recomputed(last[id(node)], values, operation_fn)
            elif id(node) not in inside and all(id(x) in values for x in node.input_tensors):
                _run_node(graph, node, values, operation_fn)
        return tree.pack_sequence_as(graph._outputs_struct, [values[id(x)] for x in graph.outputs])

    graph._run_through_graph = run_through_graph


def _run_recomputed(s: Segment, values: dict[int, Any], operation_fn: Callable[..., Any]) -> Any:
    def run(*tensors: Any) -> Any:
        local = {id(x): y for x, y in zip(s.inputs, tensors, strict=True)}
        for node in s.nodes:
            _run_node(s.graph, node, local, operation_fn)
        return local[id(s.end)]

    return recomputed(run, [values[id(x)] for x in s.inputs], {}, s.layers)


def _run_node(graph: keras.Model, node: Any, values: dict[int, Any], operation_fn: Callable[..., Any]) -> None:
    """Run one node as Keras' ``Function`` does, its outputs added to ``values``."""
    args, kwargs = node.arguments.fill_in(values)
    outputs = operation_fn(graph._get_operation_for_node(node))(*args, **kwargs)
    for x, y in zip(node.outputs, tree.flatten(outputs), strict=True):
        values[id(x)] = y
