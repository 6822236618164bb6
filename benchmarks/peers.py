"""The peers accumrun is measured against, one per process: ``python benchmarks/peers.py METHOD SPEC RESULT``.

``SPEC`` is a JSON object (``data`` and ``model`` sections as in an accumrun config, ``batch_size``,
``subdivisions``, ``epochs``); the data and the model are built exactly as accumrun builds them, from the same
seed. The child writes the wall time of each training epoch, and whether XLA compiled its step, to the JSON file
``RESULT``; ``benchmarks/run.py`` turns the times into samples/s and measures the process's peak memory from
outside.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from accumrun.config.schema import Config
from accumrun.data.dataset import load_dataset
from accumrun.models.builders import build_model

SEED = 0
LEARNING_RATE = 1e-3
PeerRun = tuple[list[float], bool]
"""What a peer returns: the seconds of each training epoch, and whether its step was compiled with XLA."""


class EpochTimer(keras.callbacks.Callback):
    """Wall time of every epoch of ``model.fit``."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self._started = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.seconds.append(time.perf_counter() - self._started)


def _loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _fit(model: keras.Model, x: np.ndarray, y: np.ndarray, batch_size: int, epochs: int, **adam: Any) -> PeerRun:
    """``model.fit`` with Adam; returns the seconds of each epoch and whether Keras compiled the step with XLA."""
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE, **adam), loss=_loss())
    timer = EpochTimer()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0, callbacks=[timer])
    # compile() keeps Keras' jit_compile="auto", which Keras resolves per device (off on a CPU).
    return timer.seconds, bool(model.jit_compile)


def keras_accum(model: keras.Model, x: np.ndarray, y: np.ndarray, spec: dict[str, Any]) -> PeerRun:
    """Keras 3's own accumulation: fit at the sub-batch size, the optimizer steps every S sub-batches."""
    steps = spec["subdivisions"]
    return _fit(model, x, y, spec["batch_size"] // steps, spec["epochs"], gradient_accumulation_steps=steps)


def fit_sub(model: keras.Model, x: np.ndarray, y: np.ndarray, spec: dict[str, Any]) -> PeerRun:
    """Plain ``model.fit`` at the sub-batch size: one update per sub-batch, no accumulation."""
    return _fit(model, x, y, spec["batch_size"] // spec["subdivisions"], spec["epochs"])


def fit_full(model: keras.Model, x: np.ndarray, y: np.ndarray, spec: dict[str, Any]) -> PeerRun:
    """Plain ``model.fit`` at the full batch size."""
    return _fit(model, x, y, spec["batch_size"], spec["epochs"])


def python_loop(model: keras.Model, x: np.ndarray, y: np.ndarray, spec: dict[str, Any]) -> PeerRun:
    """The usual TF2 recipe: a Python loop over sub-batches, each a ``tf.function`` call that adds its gradients
    into ``tf.Variable`` accumulators; every S sub-batches the mean is applied and the accumulators zeroed."""
    subdivisions = spec["subdivisions"]
    loss_fn = _loss()
    optimizer = keras.optimizers.Adam(LEARNING_RATE)
    variables = model.trainable_variables
    # Built here, outside the tf.function: variables may only be created on its first trace.
    optimizer.build(variables)
    accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]

    @tf.function
    def accumulate(x_sub: tf.Tensor, y_sub: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(y_sub, model(x_sub, training=True))
        for accumulator, gradient in zip(accumulators, tape.gradient(loss, variables), strict=True):
            accumulator.assign_add(gradient)

    @tf.function
    def apply() -> None:
        optimizer.apply_gradients([(a / subdivisions, v) for a, v in zip(accumulators, variables, strict=True)])
        for accumulator in accumulators:
            accumulator.assign(tf.zeros_like(accumulator))

    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=SEED, reshuffle_each_iteration=True)
        .batch(spec["batch_size"] // subdivisions)
    )
    seconds = []
    for _ in range(spec["epochs"]):
        started = time.perf_counter()
        # run.py only builds workloads whose samples are a multiple of the batch, so no group is left partial.
        for step, (x_sub, y_sub) in enumerate(dataset):
            accumulate(x_sub, y_sub)
            if (step + 1) % subdivisions == 0:
                apply()
        seconds.append(time.perf_counter() - started)
    return seconds, False


PEERS: dict[str, Callable[[keras.Model, np.ndarray, np.ndarray, dict[str, Any]], PeerRun]] = {
    "keras_accum": keras_accum,
    "python_loop": python_loop,
    "fit_sub": fit_sub,
    "fit_full": fit_full,
}


def run_peer(method: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Build accumrun's data and model for ``spec`` and train them with ``method``; returns what it measured."""
    # accumrun's own schema reads the sections, so every kind of model section (keras.applications included)
    # gets the same defaults as in the accumrun run.
    config = Config.model_validate({"seed": SEED, "data": spec["data"], "model": spec["model"]})
    dataset = load_dataset(config.data, seed=SEED)
    keras.utils.set_random_seed(SEED)
    # dataset.outputs, as accumrun's setup passes: the classes here, since the benchmarks classify.
    model = build_model(config.model, dataset.sample_shape, dataset.outputs)
    # The peers take float32 samples, scaled as accumrun's input layers scale the stored ones on the device.
    x = dataset.train.x.astype(np.float32) * np.float32(dataset.scale)
    seconds, jit_compile = PEERS[method](model, x, dataset.train.y, spec)
    return {"method": method, "epoch_seconds": seconds, "jit_compile": jit_compile}


def main() -> None:
    """The command line of one peer run: ``METHOD SPEC RESULT``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("method", choices=sorted(PEERS))
    parser.add_argument("spec", type=json.loads, help="JSON: data, model, batch_size, subdivisions, epochs")
    parser.add_argument("result", type=Path, help="where to write the JSON result")
    args = parser.parse_args()
    args.result.write_text(json.dumps(run_peer(args.method, args.spec)))


if __name__ == "__main__":
    main()
    # The result is written: end without TensorFlow's teardown (2 to 3 s), as the accumrun command does.
    os._exit(0)
