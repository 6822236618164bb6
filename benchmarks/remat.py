"""Benchmark ``training.remat: blocks`` against no remat: the activation memory of one sub-batch, and the time per
sample, on the built-in transformer (a causal language model) at a fixed sub-batch.

Every measurement runs in a fresh child process (this script again, with ``--child``), one after another, the modes
alternating, so each peak RSS is one run's own. A child builds the model and accumrun's compiled step (one
sub-batch per update, SGD, dropout drawn per sample), runs one update to trace it, then ``--updates`` timed ones; it
reports its RSS before the first update, its peak RSS once done (``ru_maxrss``), and the wall and CPU seconds of the
timed updates.

Activation memory: what a sub-batch's forward and backward pass hold, the peak minus the fixed part (the weights,
gradients, the compiled step, TensorFlow itself). The fixed part does not depend on the sub-batch, so each mode is
run at two sub-batch sizes and the activations per sample are the slope between them; the activation memory at the
larger size is that slope times the size. (The peak minus the RSS before the first update is given too: it also
holds the tracing.) Target: ``blocks`` holds at most 0.5x the activation memory of none, at most 1.4x the time per
sample. The machine's load average is recorded before and after: where other processes share the cores, the wall
time per sample is theirs too, so the target is judged on the CPU seconds per sample (both are reported). Run from
the repository:

    python benchmarks/remat.py [--layers 8] [--width 192] [--length 256] [--sizes 4 12] [--updates 2] [--output F]

The Markdown report goes to stdout, progress to stderr, every figure to the JSON ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES = ("none", "blocks")
TARGET_MEMORY, TARGET_TIME = 0.5, 1.4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=256, help="tokens per sample")
    parser.add_argument("--sizes", type=int, nargs=2, default=[4, 12], help="the two sub-batch sizes")
    parser.add_argument("--updates", type=int, default=2, help="timed updates per child")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    load_before = os.getloadavg()
    runs = []
    for size in args.sizes:
        for mode in MODES:
            print(f"remat {mode}, sub-batch {size} ...", file=sys.stderr, flush=True)
            runs.append(measure(args, mode, size))
    results = {"settings": vars(args) | {"output": None}, "runs": runs, "load_average": [load_before, os.getloadavg()]}
    results["figures"] = figures(runs, args.sizes)
    print(report(results))
    if args.output is not None:
        args.output.write_text(json.dumps(results, indent=2))


def measure(args: argparse.Namespace, mode: str, size: int) -> dict[str, Any]:
    """One child's report."""
    command = [sys.executable, __file__, "--child", mode, "--size", str(size)]
    command += ["--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads)]
    command += ["--length", str(args.length), "--updates", str(args.updates)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO, env=env)
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report | {"mode": mode, "size": size}


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Build, trace, and time ``args.updates`` updates of one sub-batch of ``args.size`` samples."""
    import keras
    import numpy as np
    import tensorflow as tf

    from accumrun.core.losses import sparse_categorical_crossentropy
    from accumrun.core.seeds import LayerDraws
    from accumrun.core.step import make_train_step
    from accumrun.kinds import Remat
    from accumrun.models.registry import MODELS
    from accumrun.models.remat import apply_remat
    from accumrun.models.transformer import transformer

    keras.utils.set_random_seed(0)
    vocabulary = 256
    model = transformer(
        (args.length,),
        vocabulary,
        vocabulary,
        layers=args.layers,
        heads=args.heads,
        width=args.width,
        dropout=0.1,
        causal=True,
    )
    apply_remat(model, Remat(args.child), MODELS["transformer"].blocks)
    optimizer = keras.optimizers.SGD(0.01)
    step = make_train_step(
        model, sparse_categorical_crossentropy, optimizer, 1, draws=LayerDraws(model, optimizer.iterations)
    )
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(1, vocabulary, (args.size, args.length)), tf.int32)
    y = tf.constant(rng.integers(1, vocabulary, (args.size, args.length)), tf.int32)
    before = _rss_mib()
    step(x, y)  # traced here
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.updates):
        step(x, y)
    float(optimizer.iterations.numpy())  # the updates are done
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    samples = args.updates * args.size
    return {
        "parameters": model.count_params(),
        "rss_before_mib": before,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        "seconds_per_sample": wall / samples,
        "cpu_seconds_per_sample": cpu / samples,
    }


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def figures(runs: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Activations per sample (the slope between the two sizes), at the larger size, and the ratios."""
    small, large = sizes
    by = {(run["mode"], run["size"]): run for run in runs}
    out: dict[str, Any] = {}
    for mode in MODES:
        per_sample = (by[mode, large]["peak_rss_mib"] - by[mode, small]["peak_rss_mib"]) / (large - small)
        out[mode] = {
            "activations_per_sample_mib": per_sample,
            "activations_mib": per_sample * large,
            "peak_minus_before_mib": by[mode, large]["peak_rss_mib"] - by[mode, large]["rss_before_mib"],
            "seconds_per_sample": by[mode, large]["seconds_per_sample"],
            "cpu_seconds_per_sample": by[mode, large]["cpu_seconds_per_sample"],
        }
    none, blocks = out["none"], out["blocks"]
    out["memory_ratio"] = blocks["activations_mib"] / none["activations_mib"]
    out["time_ratio"] = blocks["seconds_per_sample"] / none["seconds_per_sample"]
    out["cpu_time_ratio"] = blocks["cpu_seconds_per_sample"] / none["cpu_seconds_per_sample"]
    out["met"] = out["memory_ratio"] <= TARGET_MEMORY and out["cpu_time_ratio"] <= TARGET_TIME
    return out


def report(results: dict[str, Any]) -> str:
    figs, settings = results["figures"], results["settings"]
    small, large = settings["sizes"]
    lines = [
        f"transformer LM, {settings['layers']} blocks of width {settings['width']}, {settings['length']} tokens, "
        f"{results['runs'][0]['parameters']:,} parameters; sub-batches of {small} and {large}; load average "
        f"{results['load_average'][0][0]:.1f} before, {results['load_average'][1][0]:.1f} after",
        "",
        f"| remat | activations per sample (MiB) | activations at {large} (MiB) | peak - RSS before (MiB) "
        "| s per sample | CPU s per sample |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        f = figs[mode]
        lines.append(
            f"| {mode} | {f['activations_per_sample_mib']:.1f} | {f['activations_mib']:.0f} | "
            f"{f['peak_minus_before_mib']:.0f} | {f['seconds_per_sample']:.3f} | {f['cpu_seconds_per_sample']:.3f} |"
        )
    lines += [
        "",
        f"blocks / none: activation memory {figs['memory_ratio']:.2f}x (target <= {TARGET_MEMORY}x), time per "
        f"sample {figs['time_ratio']:.2f}x wall, {figs['cpu_time_ratio']:.2f}x CPU (target <= {TARGET_TIME}x): "
        f"{'met' if figs['met'] else 'not met'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
