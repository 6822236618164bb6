"""Time accumrun's compiled step alone, without the run loop: the experiments behind docs/performance-notes.md.

    python benchmarks/step_speed.py MODEL SUBDIVISIONS BATCH SAMPLES [--parallel N] [--xla] [--epochs E]

MODEL is ``mlp`` (784-256-256-10), ``mlp16`` (784-16-16-10) or ``cnn`` (the compute-bound darknet_cnn). It prints
the samples/s (median of the epochs after the first) and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import keras
import numpy as np

import accumrun.core.accumulation
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.step import make_train_step
from accumrun.core.sub_batches import batch_sizes
from accumrun.data.feeder import Feeder
from accumrun.data.source import ArraySource
from accumrun.models.darknet_cnn import darknet_cnn
from accumrun.models.mlp import mlp

MODELS = {
    "mlp": lambda: mlp((28, 28, 1), 10, [256, 256]),
    "mlp16": lambda: mlp((28, 28, 1), 10, [16, 16]),
    "cnn": lambda: darknet_cnn((28, 28, 1), 10, [32, 64, 96, 128, 160], [2, 2, 1, 1, 1]),
}


def main() -> None:
    """Parse the arguments, train, print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("subdivisions", type=int)
    parser.add_argument("batch", type=int)
    parser.add_argument("samples", type=int)
    parser.add_argument("--parallel", type=int, default=1, help="sub-batches the loop may run at once")
    parser.add_argument("--xla", action="store_true", help="compile the step with XLA")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    accumrun.core.accumulation.PARALLEL_SUB_BATCHES = args.parallel  # read when the step is traced
    rng = np.random.default_rng(0)
    x = rng.random((args.samples, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, args.samples).astype(np.int32)
    keras.utils.set_random_seed(0)
    model = MODELS[args.model]()
    step = make_train_step(
        model, sparse_categorical_crossentropy, keras.optimizers.Adam(1e-3), args.subdivisions, jit_compile=args.xla
    )
    feeder = Feeder(ArraySource(x, y), batch_sizes(args.samples, args.batch), seed=0, shuffle=True)
    seconds = []
    for epoch in range(args.epochs):
        started = time.perf_counter()
        for x_batch, y_batch in feeder.epoch(epoch):
            loss = step(x_batch, y_batch).loss_sum
        float(loss)  # wait for the last step
        seconds.append(time.perf_counter() - started)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.model} S={args.subdivisions} parallel={args.parallel} xla={args.xla} "
        f"epochs {[round(s, 2) for s in seconds]} s: {args.samples / statistics.median(seconds[1:]):,.0f} samples/s, "
        f"peak RSS {rss:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
