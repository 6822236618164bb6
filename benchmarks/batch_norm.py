"""What ``training.batch_norm`` costs: samples/s of each mode's step, and the time of ``precise``'s population
pass against one plain forward pass over the same samples. Writes ``docs/benchmarks-batch-norm.md``.

    python benchmarks/batch_norm.py [--samples N] [--batch B] [--subdivisions S] [--rounds R] [--out PATH]

The model is the darknet CNN of ``benchmarks/run.py``'s compute case (five conv + BatchNorm + leaky ReLU
blocks) on 28x28x1 inputs. All modes are built in one process from the same seed and timed in turns, round
after round, so that a change of the machine's load falls on all of them alike; a mode's figure is the median
of its rounds (each round is one epoch over the samples, after one untimed epoch that traces the step).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from accumrun.core.batch_norm import BatchNormStatistics, PopulationStatistics
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.step import make_train_step
from accumrun.core.sub_batches import batch_sizes, sub_batch_sizes
from accumrun.kinds import BatchNormMode
from accumrun.models.darknet_cnn import darknet_cnn

FILTERS, STRIDES = [32, 64, 96, 128, 160], [2, 2, 1, 1, 1]
MODES = (BatchNormMode.SUB_BATCH, BatchNormMode.PER_BATCH, BatchNormMode.PRECISE)
PER_BATCH_TARGET = 0.05  # per_batch may cost at most 5% samples/s against sub_batch
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--subdivisions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-batch-norm.md")
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((args.samples, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, args.samples).astype(np.int32))
    sizes = batch_sizes(args.samples, args.batch)
    starts = np.cumsum([0, *sizes[:-1]])
    chunks = [(x[s : s + n], y[s : s + n]) for s, n in zip(starts, sizes, strict=True)]
    piece = max(sub_batch_sizes(args.batch, args.subdivisions))

    epochs: dict[str, Callable[[], None]] = {}
    for mode in MODES:
        epochs[mode] = _train_epoch(mode, chunks, args.subdivisions)
    model = _model()
    statistics_ = BatchNormStatistics(model, BatchNormMode.PRECISE)
    population = PopulationStatistics(model, statistics_, piece)
    epochs["population pass"] = lambda: population(chunk for chunk, _ in chunks)
    forward = tf.function(lambda t: model(t, training=False), reduce_retracing=True)
    epochs["forward pass"] = lambda: _forward(forward, x, piece)
    # What PreciseBN's pass is: a forward pass with BatchNorm in training mode (a separate model: it moves its
    # moving statistics).
    other = _model()
    forward_training = tf.function(lambda t: other(t, training=True), reduce_retracing=True)
    epochs["forward pass, training mode"] = lambda: _forward(forward_training, x, piece)

    seconds: dict[str, list[float]] = {name: [] for name in epochs}
    for epoch in epochs.values():
        epoch()  # traces
    for _ in range(args.rounds):
        for name, epoch in epochs.items():
            begun = time.perf_counter()
            epoch()
            seconds[name].append(time.perf_counter() - begun)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    rate = {mode: args.samples / median[mode] for mode in MODES}
    cost = 1 - rate["per_batch"] / rate["sub_batch"]
    precise_ratio = median["population pass"] / median["forward pass, training mode"]
    inference_ratio = median["population pass"] / median["forward pass"]
    lines = [
        "# Benchmark: what `training.batch_norm` costs",
        "",
        f"Written by `benchmarks/batch_norm.py` (`{' '.join(_command(args))}`) on {_machine()};",
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}; {datetime.now().isoformat(timespec='seconds')}; "
        f"accumrun at {_commit()}; {time.perf_counter() - started:.0f} s in all.",
        "",
        f"darknet_cnn (filters {FILTERS}, strides {STRIDES}, 5 BatchNormalization layers), {args.samples:,} samples "
        f"of 28x28x1, batch {args.batch:,} = {args.subdivisions} sub-batches of {piece}. Every mode is timed in turn, "
        f"{args.rounds} rounds after one that traces; the figures are medians (all rounds below).",
        "",
        "| what | seconds per epoch | samples/s | against sub_batch |",
        "| --- | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        lines.append(
            f"| step, batch_norm: {mode} | {median[mode]:.2f} | {rate[mode]:,.0f} | "
            f"{rate[mode] / rate[BatchNormMode.SUB_BATCH]:.3f}x |"
        )
    lines += [
        f"| precise's population pass | {median['population pass']:.2f} | "
        f"{args.samples / median['population pass']:,.0f} | |",
        f"| one forward pass (inference, pieces of {piece}) | {median['forward pass']:.2f} | "
        f"{args.samples / median['forward pass']:,.0f} | |",
        f"| one forward pass (BatchNorm in training mode, pieces of {piece}) | "
        f"{median['forward pass, training mode']:.2f} | "
        f"{args.samples / median['forward pass, training mode']:,.0f} | |",
        "",
        "The `precise` step row is the training step alone; its population pass runs once per epoch, on top.",
        "",
        "| target | measured | result |",
        "| --- | --- | --- |",
        f"| per_batch costs <= 5% samples/s against sub_batch | {cost * 100:.1f}% | "
        f"{'met' if cost <= PER_BATCH_TARGET else 'NOT met'} |",
        f"| precise's population pass <= one extra forward pass per epoch | {precise_ratio:.2f}x a training-mode "
        f"forward pass ({inference_ratio:.2f}x an inference one) | {'met' if precise_ratio <= 1.0 else 'NOT met'} |",
        "",
        "Every round, in seconds:",
        "",
        *(f"- {name}: {', '.join(f'{s:.2f}' for s in values)}" for name, values in seconds.items()),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return darknet_cnn((28, 28, 1), 10, FILTERS, STRIDES)


def _train_epoch(
    mode: BatchNormMode, chunks: list[tuple[tf.Tensor, tf.Tensor]], subdivisions: int
) -> Callable[[], None]:
    model = _model()
    step = make_train_step(
        model,
        sparse_categorical_crossentropy,
        keras.optimizers.Adam(1e-3),
        subdivisions,
        batch_norm=BatchNormStatistics(model, mode),
    )

    def epoch() -> None:
        for x, y in chunks:
            loss = step(x, y).loss_sum
        float(loss)  # wait for the last step

    return epoch


def _forward(forward: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor, piece: int) -> None:
    for start in range(0, int(x.shape[0]), piece):
        out = forward(x[start : start + piece])
    float(tf.reduce_sum(out))


def _command(args: argparse.Namespace) -> list[str]:
    return [
        "python benchmarks/batch_norm.py",
        f"--samples {args.samples}",
        f"--batch {args.batch}",
        f"--subdivisions {args.subdivisions}",
        f"--rounds {args.rounds}",
    ]


def _machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
