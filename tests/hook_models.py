"""A model for tests that need to act inside a real training step: an MLP with a pass-through layer that, on
every training-mode forward pass (one per sub-batch), calls back into Python.

Configs name it as ``model: {name: "tests.hook_models:mlp", hidden: [8]}``; accumrun imports it from the working
directory, the repository root under pytest, also in the fresh processes that ``subdivisions: auto`` starts.
What the callback does is set per test through :data:`HOOKS`, which a fresh process sees at its defaults:
- ``largest_sub_batch``: raise ``MemoryError`` for a larger sub-batch, which TensorFlow reports from the step as
  ``ResourceExhaustedError``, as it does a real out-of-memory error;
- ``broken_once_for``: fail once on a sub-batch of this size with another error, as a runtime left broken by an
  out-of-memory error does;
- ``kill_at_forward``: SIGKILL the process on its N-th forward pass, in the middle of an update, as a machine that
  goes down does; a fresh process reads it from the environment variable ``ACCUMRUN_TEST_KILL_AT_FORWARD``;
- ``pause_seconds``: sleep this long on every forward pass, so that a run in another process is still training
  when a test signals it, however fast the machine; a fresh process reads it from
  ``ACCUMRUN_TEST_PAUSE_AT_FORWARD``.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf


def _kill_at_forward() -> int | None:
    value = os.environ.get("ACCUMRUN_TEST_KILL_AT_FORWARD")
    return int(value) if value else None


def _pause_seconds() -> float:
    return float(os.environ.get("ACCUMRUN_TEST_PAUSE_AT_FORWARD") or 0)


@dataclass
class Hooks:
    largest_sub_batch: int | None = None
    broken_once_for: int | None = None
    kill_at_forward: int | None = field(default_factory=_kill_at_forward)
    pause_seconds: float = field(default_factory=_pause_seconds)
    forwards: int = 0


HOOKS = Hooks()


def _on_forward(size: tf.Tensor) -> None:
    samples = int(size)
    HOOKS.forwards += 1
    if HOOKS.pause_seconds:
        time.sleep(HOOKS.pause_seconds)
    if HOOKS.forwards == HOOKS.kill_at_forward:
        os.kill(os.getpid(), signal.SIGKILL)
    if HOOKS.largest_sub_batch is not None and samples > HOOKS.largest_sub_batch:
        raise MemoryError(f"injected: a sub-batch of {samples} does not fit")
    if HOOKS.broken_once_for == samples:
        HOOKS.broken_once_for = None
        raise RuntimeError("injected: the runtime is broken")


class ForwardHook(keras.layers.Layer):
    """Passes its input through; in training mode (or on ``every_pass``, in inference mode too, as L-BFGS's
    evaluations run) it first calls :func:`_on_forward` with the sub-batch size."""

    def __init__(self, every_pass: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.every_pass = every_pass

    def call(self, x: Any, training: bool | None = None) -> Any:
        if training or self.every_pass:
            tf.py_function(_on_forward, [tf.shape(x)[0]], [])
        return x

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape


def mlp(input_shape: tuple[int, ...], classes: int, hidden: list[int], every_pass: bool = False) -> keras.Model:
    """Dense layers on the flattened input, with the hook first; no BatchNorm, no dropout."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(ForwardHook(every_pass)(inputs))
    for width in hidden:
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x))


def reset(**settings: Any) -> None:
    """Use these settings (the others at their defaults)."""
    global HOOKS
    HOOKS = Hooks(**settings)
