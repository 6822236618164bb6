"""Where the time of many tiny sub-batches goes: accumrun variants on the dispatch-bound case, against plain ``fit``.

The case of ``benchmarks/run.py``'s dispatch section: an MLP (hidden [256, 256]) on 16,384 synthetic 28x28x1
samples, batch 1,024 in 128 sub-batches of 8, Adam. Each variant trains 4 epochs in a fresh child process (this
script again, with ``--child``); samples/s is the median of epochs 2 to 4, from ``metrics.jsonl`` (accumrun) or a
callback (``fit``). The variants change one thing each:

- ``default``: as configured, with the accuracy metric updated on every sub-batch;
- ``no metrics``: ``metrics: []``, so only the loss is computed per sub-batch;
- ``one update per call``: ``training.updates_per_call: 1``;
- ``xla``: ``training.jit_compile: true``;
- ``bare loop``: no accumrun: one ``tf.function`` per batch whose ``tf.while_loop`` adds the 128 sub-batch
  gradients one at a time (as accumrun does), then applies Adam; no metric, no finite check. The limit of the loop
  form;
- ``bare loop, 10 at a time``: the same with TensorFlow's default ``parallel_iterations=10``, which holds up to
  10 sub-batches' activations at once;
- ``fit at B``: plain ``model.fit(batch_size=1024)``, one pass per batch (not the same training: the reference).

Run from the repository root; it writes the report to ``docs/benchmarks-dispatch.md`` and the figures beside it:

    python benchmarks/dispatch.py [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from run import machine, publish_report  # benchmarks/run.py, beside this script

SAMPLES, BATCH, SUBDIVISIONS, EPOCHS = 16_384, 1_024, 128, 4
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no metrics": {"metrics": []},
    "one update per call": {"training": {"updates_per_call": 1}},
    "xla": {"training": {"jit_compile": True}},
}
BARE_LOOPS = {"bare loop": 1, "bare loop, 10 at a time": 10}  # the variant, and its parallel_iterations


def _data(folder: Path) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    path = folder / "data.npz"
    np.savez(path, x=rng.random((SAMPLES, 28, 28, 1), dtype=np.float32), y=rng.integers(0, 10, SAMPLES))
    return path


def _accumrun(variant: str, folder: Path) -> list[float]:
    import accumrun

    sections: dict[str, Any] = {
        "data": {"name": "npz", "path": str(_data(folder)), "validation_split": 0.0},
        "model": {"name": "mlp", "hidden": [256, 256]},
        "training": {"epochs": EPOCHS, "batch_size": BATCH, "subdivisions": SUBDIVISIONS},
        "optimizer": {"name": "adam", "learning_rate": 1e-3},
        "output": {"tensorboard": False},
    }
    for key, value in VARIANTS[variant].items():
        sections[key] = {**sections[key], **value} if isinstance(value, dict) else value
    result = accumrun.train(accumrun.load_config(sections), folder / "run", quiet=True)
    return [row["samples_per_second"] for row in result.metrics]


def _mlp() -> Any:
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1))
    hidden = keras.layers.Flatten()(inputs)
    for _ in range(2):
        hidden = keras.layers.Dense(256, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10)(hidden))


def _bare_loop(folder: Path, parallel: int) -> list[float]:
    import keras
    import numpy as np
    import tensorflow as tf

    with np.load(_data(folder)) as data:
        x, y = tf.constant(data["x"]), tf.constant(data["y"])
    model = _mlp()
    variables = model.trainable_variables
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(variables)
    rows = BATCH // SUBDIVISIONS

    @tf.function(autograph=False)
    def update(start: tf.Tensor) -> None:
        def body(k: tf.Tensor, *sums: tf.Tensor) -> tuple[tf.Tensor, ...]:
            first = start + k * rows
            with tf.GradientTape() as tape:
                loss_sum = loss(y[first : first + rows], model(x[first : first + rows], training=True))
            gradients = tape.gradient(loss_sum, variables)
            return (k + 1, *(total + gradient for total, gradient in zip(sums, gradients, strict=True)))

        zeros = tuple(tf.zeros_like(v) for v in variables)
        sums = tf.while_loop(
            lambda k, *_: k < SUBDIVISIONS, body, (tf.constant(0), *zeros), parallel_iterations=parallel
        )
        optimizer.apply_gradients(zip([total / BATCH for total in sums[1:]], variables, strict=True))

    speeds = []
    for _ in range(EPOCHS):
        started = time.perf_counter()
        for start in range(0, SAMPLES, BATCH):
            update(tf.constant(start))
        float(optimizer.iterations.numpy())
        speeds.append(SAMPLES / (time.perf_counter() - started))
    return speeds


def _fit(folder: Path) -> list[float]:
    import keras
    import numpy as np

    with np.load(_data(folder)) as data:
        x, y = data["x"], data["y"]
    model = _mlp()
    model.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    speeds: list[float] = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            speeds.append(SAMPLES / (time.perf_counter() - self.started))

    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=[Timer()])
    return speeds


def _child(variant: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as folder:
        if variant in BARE_LOOPS:
            speeds = _bare_loop(Path(folder), BARE_LOOPS[variant])
        elif variant == "fit at B":
            speeds = _fit(Path(folder))
        else:
            speeds = _accumrun(variant, Path(folder))
    print(json.dumps(speeds))


def main() -> None:
    """Run every variant in its own process; print the table, write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-dispatch.md"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    info = machine()
    medians = {}
    for variant in [*VARIANTS, *BARE_LOOPS, "fit at B"]:
        print(f"{variant} ...", file=sys.stderr, flush=True)
        command = [sys.executable, __file__, "--child", variant]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        speeds = json.loads(output.strip().splitlines()[-1])
        medians[variant] = statistics.median(speeds[1:])
    fit = medians["fit at B"]
    publish_report(
        args.output,
        title="The dispatch-bound case: where the time of many tiny sub-batches goes",
        command="python benchmarks/dispatch.py",
        info=info,
        figures={"samples_per_second": medians},
        body=[
            f"MLP [256, 256], {SAMPLES:,} samples of 28x28x1, batch {BATCH:,} in {SUBDIVISIONS} sub-batches; "
            f"samples/s is the median of epochs 2 to {EPOCHS}.\n",
            "| variant | samples/s | ÷ fit at B |\n| --- | ---: | ---: |",
            *(f"| {variant} | {value:,.0f} | {value / fit:.2f}x |" for variant, value in medians.items()),
        ],
    )


if __name__ == "__main__":
    main()
