"""What a setting costs the train step: the same update under two or three settings, alternating in one process.

On a shared machine one run after another measures the machine as much as the code (``alternate.py``'s runs of
one code spread by 2x there). Here every setting has its own model and step, built from the same config but for
the setting, and the settings take turns: round after round, each makes ``--updates`` updates on the same batch,
timed by the wall clock and by the process's CPU time. The report gives each setting's median over the rounds,
per update, and its change against the first setting, in both.

Two cases:

- ``noise``: the dispatch workload of ``run.py`` (an MLP [256, 256] on 28x28x1, batch 1,024 in 128 sub-batches of
  8) without a measurement, with ``training.measure: [noise_scale]`` (every update measured), and with
  ``noise_scale_every: 10``;
- ``float64``: the full-batch MLP of ``full_batch.py`` (2,000 samples of 32 features, [64, 64], the whole set in 4
  sub-batches, Adam) under ``training.precision`` float32 and float64.

    python benchmarks/step_costs.py noise|float64 [--rounds 7] [--updates 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

CASES: dict[str, tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]] = {
    "noise": (
        {
            "data": {"name": "synthetic", "samples": 1024, "shape": [28, 28, 1], "classes": 10, "validation_split": 0},
            "model": {"name": "mlp", "hidden": [256, 256]},
            "training": {"batch_size": 1024, "subdivisions": 128},
        },
        [
            ("unmeasured", {}),
            ("noise_scale, every update", {"measure": ["noise_scale"]}),
            ("noise_scale_every: 10", {"measure": ["noise_scale"], "noise_scale_every": 10}),
        ],
    ),
    "float64": (
        {
            "data": {"name": "synthetic", "samples": 2000, "shape": [32], "classes": 10, "validation_split": 0},
            "model": {"name": "mlp", "hidden": [64, 64]},
            "training": {"batch_size": "full", "subdivisions": 4},
        },
        [("float32", {}), ("float64", {"precision": "float64"})],
    ),
}


class Setting:
    """One setting's model, step and batch, built and traced under its own precision."""

    def __init__(self, base: dict[str, Any], training: dict[str, Any]) -> None:
        import tensorflow as tf

        from accumrun.config.loading import load_config
        from accumrun.core.step import make_train_step
        from accumrun.models.floats import floats
        from accumrun.training.setup import build_training

        config = load_config(
            {
                "seed": 0,
                **base,
                "training": {**base["training"], **training},
                "optimizer": {"name": "adam", "learning_rate": 1e-3},
                "output": {"tensorboard": False},
            }
        )
        self._floats = lambda: floats(config.training.precision)
        with self._floats():
            setup = build_training(config)
            trained, stepped = setup.trained, setup.stepped
            self._step = make_train_step(
                trained.model,
                trained.objective.objective,
                trained.optimizer,
                stepped.step_spec(config.training.subdivisions),
            )
            held = setup.fed.dataset.train.in_memory
            assert held is not None
            self._batch = [(tf.constant(held.x), tf.constant(held.y))]
            self._samples = len(held.x)
            self.run(3)  # tracing, and the first calls' own costs

    def run(self, updates: int) -> tuple[float, float]:
        """Seconds of wall clock and of CPU for ``updates`` updates."""
        with self._floats():
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(updates):
                result = self._step.train_batch(self._batch, self._samples)
            float(result.loss_sum)  # the last update has finished
            return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--rounds", type=int, default=7, help="rounds of turns (default 7)")
    parser.add_argument("--updates", type=int, default=20, help="updates per turn (default 20)")
    args = parser.parse_args()
    base, settings = CASES[args.case]
    built = [(name, Setting(base, training)) for name, training in settings]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in built}
    for round_ in range(args.rounds):
        # Each round starts with another setting, so none always runs first after the others.
        for name, setting in built[round_ % len(built) :] + built[: round_ % len(built)]:
            times[name].append(setting.run(args.updates))
    medians = {
        name: tuple(statistics.median(t[i] for t in runs) / args.updates * 1e3 for i in (0, 1))
        for name, runs in times.items()
    }
    first_wall, first_cpu = next(iter(medians.values()))
    print(f"{args.case}: {args.rounds} rounds of {args.updates} updates per setting, alternating")
    print("| setting | ms/update (wall) | change | ms/update (CPU) | change |")
    print("|---|---:|---:|---:|---:|")
    for name, (wall, cpu) in medians.items():
        print(f"| {name} | {wall:.2f} | {wall / first_wall - 1:+.1%} | {cpu:.2f} | {cpu / first_cpu - 1:+.1%} |")


if __name__ == "__main__":
    main()
