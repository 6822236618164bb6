"""Accumulation against rematerialization at one batch size and one memory budget: the fewest subdivisions that fit
the budget without remat (so the most sub-batches of the two), against fewer subdivisions with ``remat: blocks``.

Every (subdivisions, remat) pair of the model of ``plan_accuracy.py`` is measured in a fresh process
(:func:`accumrun.training.probe.measure_in_fresh_process`: the first batch three times; the peak above TensorFlow's
import on a CPU, ``get_memory_info``'s on a GPU; the best time of the last two). The budget is set just above the
peak without remat at ``--budget-subdivisions`` (4), so that is the fewest that fit without remat; then the fewest
that fit with ``blocks`` are found, and the two are compared in samples/s and peak.

    python benchmarks/remat_vs_accumulation.py [--preset cpu|gpu] [--budget-subdivisions 4] [--output PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from plan_accuracy import PRESETS, config_for  # beside this script
from run import REPO, machine, publish_report

MODES = ("none", "blocks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--budget-subdivisions", type=int, default=4)
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks-remat-vs-accumulation.md")
    args = parser.parse_args()
    info = machine()
    started = time.monotonic()

    from accumrun.config.loading import load_config
    from accumrun.config.memory_budget import mib
    from accumrun.core.footprint import candidate_subdivisions
    from accumrun.training.probe import measure_in_fresh_process

    preset = PRESETS[args.preset]
    batch = preset["batch_size"]
    measured = {}
    for mode in MODES:
        config = load_config(config_for(preset), [f"training.remat={mode}"])
        for subdivisions in candidate_subdivisions(batch, None):
            print(f"[{time.monotonic() - started:6.0f} s] {mode}, subdivisions {subdivisions}", file=sys.stderr)
            measured[mode, subdivisions] = measure_in_fresh_process(config, subdivisions)
    budget = int((measured["none", args.budget_subdivisions].peak or 0) * 1.02)

    def fewest(mode: str) -> int:
        fitting = [s for (m, s), probe in measured.items() if m == mode and probe.peak and probe.peak <= budget]
        return min(fitting)

    chosen = {mode: fewest(mode) for mode in MODES}
    rows = []
    for mode in MODES:
        probe = measured[mode, chosen[mode]]
        rows.append(
            {
                "remat": mode,
                "subdivisions": chosen[mode],
                "peak": probe.peak,
                "samples_per_second": 1 / (probe.seconds_per_sample or float("inf")),
            }
        )
    ratio = rows[1]["samples_per_second"] / rows[0]["samples_per_second"]
    body = [
        f"Model: `plan_accuracy.py`'s {args.preset} preset ({preset['layers']} layers, width {preset['width']}, "
        f"sequence {preset['sequence_length']}), batch {batch}, Adam. Budget {mib(budget)}: 2% above the peak without "
        f"remat at {args.budget_subdivisions} subdivisions. samples/s from the best of two timed batches after the "
        "first (which traces the step).",
        "",
        "| at the budget | subdivisions | sub-batch | peak | samples/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        body.append(
            f"| remat {row['remat']} | {row['subdivisions']} | {-(-batch // row['subdivisions'])} | {mib(row['peak'])} "
            f"| {row['samples_per_second']:,.1f} |"
        )
    body += [
        "",
        f"`blocks` at {chosen['blocks']} subdivisions: {ratio:.2f}x the samples/s of no remat at {chosen['none']}.",
        "",
        "Every pair measured:",
        "",
        "| remat | subdivisions | sub-batch | peak | samples/s | fits |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for (mode, subdivisions), probe in measured.items():
        rate = f"{1 / probe.seconds_per_sample:,.1f}" if probe.seconds_per_sample else "-"
        peak = mib(probe.peak) if probe.peak else "out of memory"
        fits = "yes" if probe.peak and probe.peak <= budget else "no"
        body.append(f"| {mode} | {subdivisions} | {-(-batch // subdivisions)} | {peak} | {rate} | {fits} |")
    info["wall_seconds"] = round(time.monotonic() - started)
    publish_report(
        args.output,
        title="Accumulation against rematerialization at one batch and one budget",
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        info=info,
        figures={
            "preset": preset,
            "budget": budget,
            "chosen": rows,
            "all": [
                {"remat": m, "subdivisions": s, "peak": p.peak, "seconds_per_sample": p.seconds_per_sample}
                for (m, s), p in measured.items()
            ],
        },
        body=body,
    )


if __name__ == "__main__":
    main()
