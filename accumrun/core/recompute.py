"""Recomputation: a call whose activations are not kept for the backward pass but computed again there, the same.

:func:`recomputed` runs a call through ``tf.recompute_grad``, which works inside a ``tf.function`` where Keras'
``RematScope(mode="full")`` does not (keras#21207: its custom gradient takes keyword arguments only eagerly). The
call's floating-point tensors are its positional arguments; everything else (``training``, masks, ids) is bound
outside, so the recomputed function is positional-only (:class:`accumrun.core.flat_call.FlatCall`). The variables
it reads are the ones ``tf.recompute_grad`` finds by watching the first run, and get their gradients from the
recomputation.

The recomputation must be the first run again, number for number, or remat would change the update:

- the random layers draw what they drew: whatever draws inside the step registers a replay point
  (:func:`replayable`, the per-sample draws of :mod:`accumrun.core.seeds`), taken when the first run starts and
  restored around the second;
- the state the call reads (moving statistics, seed generators: its layers' non-trainable variables) is read as the
  first run read it, and what the recomputation would write is dropped (a ``keras.StatelessScope``), so a BatchNorm
  moves its statistics once;
- Keras' call context (``training``, for layers called without it) and mixed precision's autocast scope are those
  of the first run, which ran inside the outer layer's ``__call__``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.common import global_state
from keras.src.backend.common.variables import AutocastScope

from accumrun.core.flat_call import FlatCall

ReplayPoint = Callable[[], Callable[[], contextlib.AbstractContextManager[None]]]
"""Taken when a first run starts: it returns the context that makes a recomputation see what that run saw."""

_KERAS_STATE = ("current_call_ctx", "autocast_scope")
"""The parts of Keras' global state that a layer's ``call`` reads from its ``__call__``."""

_open = threading.local()  # MirroredStrategy traces each replica on a thread of its own


@contextlib.contextmanager
def replayable(point: ReplayPoint) -> Iterator[None]:
    """While open on this thread, every recomputation replays what ``point`` takes at its first run."""
    points = _points()
    points.append(point)
    try:
        yield
    finally:
        points.remove(point)


def training_now() -> bool:
    """Whether the layer call running now trains (Keras' call context): only a training pass has a backward pass to
    recompute for, so inference and the measurements' double backward passes run as they are."""
    context = global_state.get_global_attribute("current_call_ctx")
    return bool(context is not None and getattr(context, "training", None))


def recomputed(
    call: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], layers: Sequence[keras.layers.Layer]
) -> Any:
    """``call(*args, **kwargs)``, its activations recomputed in the backward pass; ``layers`` are the layers it runs
    (with the layers inside them), whose state and calls the recomputation replays."""
    flat_call = FlatCall(call, args, kwargs)
    replay = _replay_point(_inside(layers))

    def run(*tensors: tf.Tensor) -> list[tf.Tensor]:
        with replay() if flat_call.ran else contextlib.nullcontext():
            return flat_call(*tensors)

    return flat_call.structured(tf.recompute_grad(run)(*flat_call.inputs))


def _points() -> list[ReplayPoint]:
    if not hasattr(_open, "points"):
        _open.points = []
    points: list[ReplayPoint] = _open.points
    return points


def _inside(layers: Sequence[keras.layers.Layer]) -> list[keras.layers.Layer]:
    """``layers`` and every layer inside them, once each."""
    found = {id(sub): sub for layer in layers for sub in layer._flatten_layers(include_self=True, recursive=True)}
    return list(found.values())


def _replay_point(layers: list[keras.layers.Layer]) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """What the first run sees now: the draws' replays, Keras' call context and autocast scope, the calls of
    ``layers`` (a BatchNorm's is wrapped while the step is traced, :mod:`accumrun.core.batch_norm`), and the values of
    their non-trainable variables (read without autocasting, as the variables hold them)."""
    replays = [point() for point in _points()]
    keras_state = {name: global_state.get_global_attribute(name) for name in _KERAS_STATE}
    calls = {id(layer): layer.__dict__.get("call") for layer in layers}
    with AutocastScope(None):
        state = {id(v): v for layer in layers for v in layer.non_trainable_variables}
        values = [(v, tf.convert_to_tensor(v.value)) for v in state.values()]

    @contextlib.contextmanager
    def replay() -> Iterator[None]:
        before = {name: global_state.get_global_attribute(name) for name in _KERAS_STATE}
        calls_before = {id(layer): layer.__dict__.get("call") for layer in layers}
        try:
            for name, value in keras_state.items():
                global_state.set_global_attribute(name, value)
            _set_calls(layers, calls)
            scope = keras.StatelessScope(state_mapping=values, initialize_variables=False)
            with scope, contextlib.ExitStack() as stack:
                for each in replays:
                    stack.enter_context(each())
                yield
        finally:
            for name, value in before.items():
                global_state.set_global_attribute(name, value)
            _set_calls(layers, calls_before)

    return replay


def _set_calls(layers: list[keras.layers.Layer], calls: dict[int, Any]) -> None:
    """Give each layer its own ``call`` (None: the class's)."""
    for layer in layers:
        call = calls[id(layer)]
        if call is not None:
            layer.call = call
        elif "call" in layer.__dict__:
            del layer.call
