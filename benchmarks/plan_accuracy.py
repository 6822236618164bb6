"""How close ``accumrun plan``'s predicted peaks come to measured ones: for each variant of a small causal language
model (precision, LoRA, int8, whatever ``--variants`` names), plan's probes at three sub-batch sizes predict every
candidate's peak; then each candidate plan did not probe is measured on its own, in a fresh process, the same way
(:func:`accumrun.training.probe.measure_in_fresh_process`: the first batch three times, the peak memory above
TensorFlow's import on a CPU, ``get_memory_info``'s peak on a GPU). Target: every prediction within 15% of the
measured peak, over at least six candidates.

    python benchmarks/plan_accuracy.py [--preset cpu|gpu] [--variants NAME,...] [--validate S,...] [--output PATH]

``--preset gpu`` is a larger model for a GPU (it refuses to run without one). Progress goes to stderr; the report to
``--output`` (Markdown), its figures beside it as JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from run import REPO, machine, publish_report  # benchmarks/run.py, beside this script

PRESETS: dict[str, dict[str, Any]] = {
    # About 0.4M parameters: the activations of a sub-batch of 32 windows of 256 tokens dwarf the weights.
    "cpu": {"sequence_length": 256, "batch_size": 32, "layers": 2, "heads": 4, "width": 128},
    # About 25M parameters: sized for one GPU of 16 GiB or more.
    "gpu": {"sequence_length": 512, "batch_size": 64, "layers": 8, "heads": 8, "width": 512},
}
VARIANTS: dict[str, tuple[str, ...]] = {
    "float32": ("training.precision=float32",),
    "mixed_bfloat16": ("training.precision=mixed_bfloat16",),
    "lora_r8": ("model.lora={rank: 8}",),
    "lora_r8_int8": ("model.lora={rank: 8}", "model.quantize=int8"),
    "remat_blocks": ("training.remat=blocks",),
}


def config_for(preset: dict[str, Any]) -> dict[str, Any]:
    """A byte-level causal language model on the bundled corpus, as the preset sizes it."""
    return {
        "seed": 0,
        "data": {
            "name": "text_corpus",
            "path": str(REPO / "datasets" / "coriolanus.txt"),
            "tokenizer": {"name": "byte"},
            "sequence_length": preset["sequence_length"],
            "validation_split": 0.0,
        },
        "model": {
            "name": "transformer",
            "layers": preset["layers"],
            "heads": preset["heads"],
            "width": preset["width"],
        },
        "training": {"epochs": 1, "batch_size": preset["batch_size"], "subdivisions": 1},
        "optimizer": {"name": "adam", "learning_rate": 0.001},
        "output": {"tensorboard": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="names from VARIANTS, comma-separated")
    parser.add_argument("--validate", help="the subdivisions to measure, comma-separated (all that plan did not probe)")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks-plan.md")
    args = parser.parse_args()
    info = machine()
    started = time.monotonic()

    import tensorflow as tf

    from accumrun.config.loading import load_config
    from accumrun.config.memory_budget import mib
    from accumrun.training.budget import setup_footprint
    from accumrun.training.plan import make_plan
    from accumrun.training.probe import measure_in_fresh_process
    from accumrun.training.setup import build_training

    if args.preset == "gpu" and not tf.config.list_logical_devices("GPU"):
        sys.exit("--preset gpu needs a GPU")
    info["device"] = "GPU (get_memory_info peak)" if tf.config.list_logical_devices("GPU") else "CPU (peak RSS)"
    preset = PRESETS[args.preset]
    base = load_config(config_for(preset))

    def echo(line: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {line}", file=sys.stderr, flush=True)

    results, body = [], []
    for name in args.variants.split(","):
        overrides = VARIANTS[name]
        config = load_config(config_for(preset), overrides)
        fixed = setup_footprint(build_training(config))
        plan = make_plan(
            base,
            fixed,
            None,
            [(o.partition("=")[0], [o.partition("=")[2]]) for o in overrides],
            measure_in_fresh_process,
            echo,
        )
        for row in plan.rows:
            chosen = args.validate is None or str(row.subdivisions) in args.validate.split(",")
            if row.probed or row.peak is None or not chosen:
                continue
            echo(f"{name}: measuring subdivisions {row.subdivisions}")
            measured = measure_in_fresh_process(row.variant.config, row.subdivisions)
            error = (row.peak - measured.peak) / measured.peak if measured.peak else math.nan
            results.append(
                {
                    "variant": name,
                    "subdivisions": row.subdivisions,
                    "sub_batch": row.sub_batch,
                    "predicted_peak": row.peak,
                    "measured_peak": measured.peak,
                    "relative_error": error,
                    "predicted_seconds_per_sample": row.seconds_per_sample,
                    "measured_seconds_per_sample": measured.seconds_per_sample,
                    "fixed_bytes": fixed.fixed(row.sub_batch),
                    "probes": [[p.subdivisions, p.peak] for p in plan.fitted[0].probes],
                    "activations_per_sample": plan.fitted[0].activations_per_sample,
                    "runtime": plan.fitted[0].runtime,
                }
            )
    worst = max(abs(r["relative_error"]) for r in results)
    body += [
        f"Model: a causal transformer ({preset['layers']} layers, width {preset['width']}, {preset['heads']} heads) on "
        f"byte windows of {preset['sequence_length']} tokens, batch {preset['batch_size']}, Adam. For each variant, "
        "`plan` probes three sub-batch sizes (the largest that fits, the smallest, and the one nearest their geometric "
        "mean) in fresh processes and predicts every other candidate from the lines between them; each of those is "
        "then measured alone, in a fresh process, the same way. Activations per sample: the slope between the two "
        "largest probes.",
        "",
        f"**Worst error {worst:.1%} over {len(results)} candidates** (target: within 15% over at least six: "
        f"{'met' if worst <= 0.15 and len(results) >= 6 else 'not met'}).",
        "",
        "| variant | S | sub-batch | fixed (arithmetic) | activations/sample | predicted peak | measured peak | error "
        "| predicted ms/sample | measured ms/sample |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        body.append(
            f"| {r['variant']} | {r['subdivisions']} | {r['sub_batch']} | {mib(r['fixed_bytes'])} "
            f"| {mib(r['activations_per_sample'])} | {mib(r['predicted_peak'])} | {mib(r['measured_peak'])} "
            f"| {r['relative_error']:+.1%} | {r['predicted_seconds_per_sample'] * 1e3:.3f} "
            f"| {r['measured_seconds_per_sample'] * 1e3:.3f} |"
        )
    info["wall_seconds"] = round(time.monotonic() - started)
    publish_report(
        args.output,
        title="accumrun plan: predicted against measured peaks",
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        info=info,
        figures={"preset": preset, "worst_relative_error": worst, "candidates": results},
        body=body,
    )


if __name__ == "__main__":
    main()
