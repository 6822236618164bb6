"""What per-sample dropout costs: the step with per-sample draws against per-sub-batch draws.

An MLP (hidden [256, 256], dropout 0.5 after each hidden layer) on synthetic 28x28x1 samples, batch 1,024 in 16
sub-batches of 64, Adam: the step of ``training.random_draws: per_sample`` (each sample's masks hashed from its
row) against ``per_sub_batch`` (Keras' own draw, one per sub-batch). Both steps are built in this process from
the same seed and timed in turns, round after round, so that a change of the machine's load falls on both alike;
a step's figure is the median of its rounds (one epoch each, after one untimed epoch that traces the step).

Run from the repository root; it writes the report to ``docs/benchmarks-dropout.md`` and the figures beside it:

    python benchmarks/dropout.py [--samples N] [--batch B] [--subdivisions S] [--rounds R] [--output PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from run import machine, publish_report  # benchmarks/run.py, beside this script

from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.seeds import LayerDraws
from accumrun.core.step import make_train_step
from accumrun.core.sub_batches import batch_sizes, sub_batch_sizes
from accumrun.kinds import RandomDraws
from accumrun.models.mlp import mlp

HIDDEN, DROPOUT = [256, 256], 0.5
COST_TARGET = 0.05  # per-sample draws may cost at most 5% samples/s against per-sub-batch ones


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--subdivisions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-dropout.md"))
    args = parser.parse_args()
    info = machine()
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((args.samples, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, args.samples).astype(np.int32))
    sizes = batch_sizes(args.samples, args.batch)
    starts = np.cumsum([0, *sizes[:-1]])
    batches = [(x[s : s + n], y[s : s + n]) for s, n in zip(starts, sizes, strict=True)]

    epochs = {mode: _train_epoch(mode, batches, args.subdivisions) for mode in RandomDraws}
    seconds: dict[RandomDraws, list[float]] = {mode: [] for mode in RandomDraws}
    for epoch in epochs.values():
        epoch()  # traces
    for _ in range(args.rounds):
        for mode, epoch in epochs.items():
            begun = time.perf_counter()
            epoch()
            seconds[mode].append(time.perf_counter() - begun)
    rate = {mode: args.samples / statistics.median(values) for mode, values in seconds.items()}
    cost = 1 - rate[RandomDraws.PER_SAMPLE] / rate[RandomDraws.PER_SUB_BATCH]
    piece = max(sub_batch_sizes(args.batch, args.subdivisions))
    body = [
        f"mlp (hidden {HIDDEN}, dropout {DROPOUT}), {args.samples:,} samples of 28x28x1, batch {args.batch:,} = "
        f"{args.subdivisions} sub-batches of {piece}, Adam. Both steps are timed in turn, {args.rounds} rounds after "
        f"one that traces; the figures are medians. {time.perf_counter() - started:.0f} s in all.",
        "",
        "| training.random_draws | seconds per epoch | samples/s | against per_sub_batch |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {mode} | {statistics.median(seconds[mode]):.2f} | {rate[mode]:,.0f} | "
            f"{rate[mode] / rate[RandomDraws.PER_SUB_BATCH]:.3f}x |"
            for mode in RandomDraws
        ),
        "",
        "| target | measured | result |",
        "| --- | --- | --- |",
        f"| per-sample draws cost <= 5% samples/s against per-sub-batch draws | {cost * 100:.1f}% | "
        f"{'met' if cost <= COST_TARGET else 'NOT met'} |",
        "",
        "Every round, in seconds:",
        "",
        *(f"- {mode}: {', '.join(f'{s:.2f}' for s in values)}" for mode, values in seconds.items()),
    ]
    publish_report(
        args.output,
        title="Benchmark: what per-sample dropout costs",
        command=" ".join(["python", "benchmarks/dropout.py", *sys.argv[1:]]),
        info=info,
        figures={"samples_per_second": {str(m): r for m, r in rate.items()}, "cost": cost, "seconds": seconds},
        body=body,
    )


def _train_epoch(
    mode: RandomDraws, batches: list[tuple[tf.Tensor, tf.Tensor]], subdivisions: int
) -> Callable[[], None]:
    keras.utils.set_random_seed(0)
    model = mlp((28, 28, 1), 10, HIDDEN, "relu", DROPOUT)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    draws = LayerDraws(model, optimizer.iterations, mode)
    step = make_train_step(model, sparse_categorical_crossentropy, optimizer, subdivisions, draws=draws)

    def epoch() -> None:
        for x, y in batches:
            loss = step(x, y).loss_sum
        float(loss)  # wait for the last step

    return epoch


if __name__ == "__main__":
    main()
