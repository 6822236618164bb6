"""Benchmark full-batch gradient descent: accumrun's cost per update against a bare compiled loop and Keras ``fit``.

The case: 2,000 synthetic samples of 32 features in 10 classes, an MLP (hidden [64, 64]), ``batch_size: full``
in 4 sub-batches, Adam (1e-3), no validation. Every epoch is one update, so the cost per update is the cost per
epoch. Three methods, each in a fresh child process (this script again, with ``--child``):

- accumrun: ``accumrun.train(config, run_dir, quiet=True)``, TensorBoard off, every other key at its default
  (``training.updates_per_call: auto``, ``output.checkpoint_every: 10min``);
- bare: one ``tf.function`` that computes the 4 sub-batches' gradients, weights them by sample count, and makes one
  Adam update, called from a Python loop on tensors already on the device: the compiled-loop limit;
- fit: ``model.fit(x, y, batch_size=2000, shuffle=True, verbose=0)``, the same model and optimizer.

Each method trains in a child of its own, and its cost per update is the mean over its steady state, after the
first :data:`WARMUP` updates (tracing, the first timings): accumrun's from its ``metrics.jsonl`` rows (every
epoch's wall time, the host's work at its end included), the bare loop's from a timer around its remaining
updates, ``fit``'s from a callback around each epoch. accumrun and the bare loop train ``--epochs`` epochs (default
2,000), ``fit`` a tenth of them (it is slow enough to measure in fewer). accumrun's breakdown comes from two
Python profiles, of ``--epochs`` and of a tenth of them: their difference, per further update, in the compiled
calls, the checkpoints, the metrics rows and the rest of the host's work, so tracing and startup cancel out.

Run from the repository root; it writes the report to ``docs/benchmarks-full-batch.md`` and the figures beside it
(``--output`` names another Markdown file):

    python benchmarks/full_batch.py [--epochs E] [--output PATH]
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

from run import machine, publish_report  # benchmarks/run.py, beside this script

SAMPLES, FEATURES, CLASSES, HIDDEN, SUBDIVISIONS, RATE = 2000, 32, 10, [64, 64], 4, 1e-3
WARMUP = 10
"""Updates left out at the start of every method's timing."""


def _data() -> tuple[object, object]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    y = (x[:, :CLASSES] + 0.5 * rng.normal(size=(SAMPLES, CLASSES))).argmax(axis=1).astype(np.int32)
    return x, y


def _model() -> object:
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    hidden = inputs
    for width in HIDDEN:
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


def _accumrun(epochs: int, folder: Path) -> list[float]:
    import numpy as np

    import accumrun

    x, y = _data()
    np.savez(folder / "data.npz", x=x, y=y)
    config = accumrun.load_config(
        {
            "data": {"name": "npz", "path": str(folder / "data.npz"), "validation_split": 0.0},
            "model": {"name": "mlp", "hidden": HIDDEN},
            "training": {"epochs": epochs, "batch_size": "full", "subdivisions": SUBDIVISIONS},
            "optimizer": {"name": "adam", "learning_rate": RATE},
            "output": {"tensorboard": False},
        }
    )
    result = accumrun.train(config, folder / "run", quiet=True)
    return [row["seconds"] for row in result.metrics[WARMUP:]]


def _bare(epochs: int, folder: Path) -> list[float]:
    import keras
    import numpy as np
    import tensorflow as tf

    x_all, y_all = (tf.constant(a) for a in _data())
    model, optimizer = _model(), keras.optimizers.Adam(RATE)
    optimizer.build(model.trainable_variables)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    bounds = np.linspace(0, SAMPLES, SUBDIVISIONS + 1).astype(int)

    @tf.function
    def update(order: tf.Tensor) -> tf.Tensor:
        x, y = tf.gather(x_all, order), tf.gather(y_all, order)
        total = [tf.zeros_like(v) for v in model.trainable_variables]
        loss_sum = tf.constant(0.0)
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            with tf.GradientTape() as tape:
                part = tf.reduce_sum(loss(y[start:end], model(x[start:end], training=True)))
                share = part / SAMPLES
            gradients = tape.gradient(share, model.trainable_variables)
            total = [t + g for t, g in zip(total, gradients, strict=True)]
            loss_sum += part
        optimizer.apply_gradients(zip(total, model.trainable_variables, strict=True))
        return loss_sum

    def order(epoch: int) -> tf.Tensor:
        return tf.constant(np.random.default_rng([0, epoch]).permutation(SAMPLES).astype(np.int32))

    for epoch in range(WARMUP):
        float(update(order(epoch)))
    started = time.perf_counter()
    for epoch in range(WARMUP, epochs):
        loss_sum = update(order(epoch))
    float(loss_sum)  # wait for the device
    return [(time.perf_counter() - started) / (epochs - WARMUP)]


def _fit(epochs: int, folder: Path) -> list[float]:
    import keras

    x, y = _data()
    model = _model()
    model.compile(keras.optimizers.Adam(RATE), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seconds: list[float] = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            seconds.append(time.perf_counter() - self.started)

    model.fit(x, y, batch_size=SAMPLES, epochs=epochs // 10, shuffle=True, verbose=0, callbacks=[Timer()])
    return seconds[WARMUP:]


METHODS = {"accumrun": _accumrun, "bare": _bare, "fit": _fit}


def _child(method: str, epochs: int, profile: str | None) -> None:
    """Train ``epochs`` epochs with ``method``; print the seconds of each update of its steady state."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import accumrun  # noqa: F401

    with tempfile.TemporaryDirectory() as folder:
        if profile:
            import cProfile

            cProfile.runctx("METHODS[method](epochs, Path(folder))", globals(), locals(), profile)
            print(json.dumps([]))
        else:
            print(json.dumps(METHODS[method](epochs, Path(folder))))


def _run(method: str, epochs: int, profile: str | None = None) -> list[float]:
    command = [sys.executable, __file__, "--child", method, str(epochs)] + (["--profile", profile] if profile else [])
    print(f"{method}, {epochs} epochs ...", file=sys.stderr, flush=True)
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return list(json.loads(output.strip().splitlines()[-1]))


PROFILED = {
    "training (Trainer.fit)": ("loop.py", "fit"),
    "the compiled calls": ("batches.py", "run"),
    "checkpoints": ("checkpoints.py", "save"),
    "metrics rows (file, TensorBoard, console)": ("log.py", "epoch"),
}


def _cumulative(profile: str) -> dict[str, float]:
    """Seconds spent in each of :data:`PROFILED`'s functions, their callees included."""
    import pstats

    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return {
        label: sum(entry[3] for (path, _, name), entry in stats.items() if path.endswith(file) and name == function)
        for label, (file, function) in PROFILED.items()
    }


def _breakdown(short: str, long: str, updates: int) -> list[tuple[str, float]]:
    """Milliseconds per further update in each of :data:`PROFILED`'s functions: the difference of two profiles,
    so that tracing and startup cancel out; the host's own share is what training spends outside the rest."""
    before, after = _cumulative(short), _cumulative(long)
    found = {label: 1000 * (after[label] - before[label]) / updates for label in PROFILED}
    total = found.pop("training (Trainer.fit)")
    return [*found.items(), ("the rest of the host's work per update", total - sum(found.values()))]


def main() -> None:
    """Run every method twice, print the report, write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2000)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-full-batch.md"))
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "EPOCHS"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.profile)
        return
    info = machine()
    long = args.epochs
    short = long // 10
    per_update = {method: 1000 * statistics.mean(_run(method, long)) for method in METHODS}
    with tempfile.TemporaryDirectory() as folder:
        profiles = [str(Path(folder) / f"accumrun-{epochs}.prof") for epochs in (short, long)]
        _run("accumrun", short, profiles[0])
        _run("accumrun", long, profiles[1])
        breakdown = _breakdown(*profiles, long - short)
    over_bare, over_fit = per_update["accumrun"] / per_update["bare"], per_update["accumrun"] / per_update["fit"]
    publish_report(
        args.output,
        title="Full-batch gradient descent: the cost of an update",
        command="python benchmarks/full_batch.py",
        info=info,
        figures={
            "ms_per_update": per_update,
            "accumrun_over_bare": over_bare,
            "accumrun_over_fit": over_fit,
            "profile_ms_per_update": dict(breakdown),
            "epochs": long,
        },
        body=[
            f"{SAMPLES:,} samples of {FEATURES} features, MLP {HIDDEN}, batch full in {SUBDIVISIONS} sub-batches, "
            f"Adam; the mean cost of an update after the first {WARMUP}, over {long:,} epochs ({long // 10:,} for "
            "fit).\n",
            "| method | ms per update |\n| --- | ---: |",
            *(f"| {method} | {value:.2f} |" for method, value in per_update.items()),
            f"\naccumrun / bare: {over_bare:.2f}x (target <= 2x); accumrun / fit: {over_fit:.2f}x (target < 1x)\n",
            "| where accumrun's time per further update goes (two profiles' difference) | ms |\n| --- | ---: |",
            *(f"| {label} | {value:.2f} |" for label, value in breakdown),
        ],
    )


if __name__ == "__main__":
    main()
