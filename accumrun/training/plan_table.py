"""``accumrun plan``'s output: the plan as lines to print and as the JSON document ``--json`` writes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from accumrun.config.memory_budget import mib
from accumrun.training.plan import Plan, Row


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _fits(row: Row) -> str:
    return "-" if row.fits is None else ("yes" if row.fits else "no")


def plan_lines(plan: Plan) -> list[str]:
    """The fixed bytes, each variant's measured line, a row per candidate (``*``: probed), the recommendation."""
    fixed = plan.footprint
    budget = f"memory_budget {mib(plan.budget)}" if plan.budget is not None else "no memory_budget"
    lines = [
        f"plan: batch {fixed.batch_size:,}, {budget}",
        f"  fixed bytes (arithmetic): parameters {mib(fixed.parameters)}, optimizer state {mib(fixed.optimizer_state)}"
        f", accumulators {mib(fixed.accumulators)}, input {fixed.input_per_sample:,} bytes per sample "
        f"(data.feed: {fixed.feed.value})",
    ]
    for fitted in plan.fitted:
        probed = ", ".join(
            f"{p.subdivisions} ({'out of memory' if p.peak is None else mib(p.peak)})" for p in fitted.probes
        )
        name = " ".join(fitted.variant.overrides) or "as configured"
        if math.isnan(fitted.activations_per_sample):
            lines.append(f"  {name}: out of memory at every size probed ({probed})")
            continue
        # On a small model a process's peak moves more with the allocator than with the sub-batch.
        per_sample = fitted.activations_per_sample
        activations = f"{mib(per_sample)} per sample" if per_sample > 0 else "too small to see in the peaks"
        lines.append(
            f"  {name}: activations {activations}, runtime {mib(fitted.runtime)}; probed subdivisions {probed}"
        )
    # LoRA's column only where a variant has it.
    lora = any(fitted.variant.lora for fitted in plan.fitted)
    lines.append(
        f"  {'subdivisions':>12}  {'sub-batch':>9}  {'precision':>15}  {'remat':>11}{'  lora' if lora else ''}"
        f"  {'peak':>14}"
        f"  {'ms/sample':>9}  {'fits':>4}"
    )
    for row in plan.rows:
        peak = "-" if row.peak is None else mib(row.peak)
        adapters = f"  {row.variant.lora or 'none'}" if lora else ""
        lines.append(
            f"  {row.subdivisions:>12,}  {row.sub_batch:>9,}  {row.variant.precision:>15}  {row.variant.remat:>11}"
            f"{adapters}  {peak:>14}"
            f"  {_ms(row.seconds_per_sample):>9}  {_fits(row):>4}{' *' if row.probed else ''}"
        )
    lines.append("  (* probed; the other rows are predicted from the probes)")
    if plan.recommended is None:
        lines.append("recommended: none fits the budget")
    else:
        lines.append("recommended: " + " ".join(f"--set {override}" for override in plan.recommended))
    return lines


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as JSON: the fixed bytes, the variants with their probes, the rows and the recommendation."""
    fixed = dataclasses.asdict(plan.footprint)
    fixed["feed"] = plan.footprint.feed.value
    return {
        "memory_budget": plan.budget,
        "fixed": fixed,
        "variants": [
            {
                "overrides": list(fitted.variant.overrides),
                "activations_per_sample": None
                if math.isnan(fitted.activations_per_sample)
                else fitted.activations_per_sample,
                "runtime": None if math.isnan(fitted.runtime) else fitted.runtime,
                "probes": [dataclasses.asdict(probe) for probe in fitted.probes],
            }
            for fitted in plan.fitted
        ],
        "rows": [
            {
                "overrides": list(row.variant.overrides),
                "subdivisions": row.subdivisions,
                "sub_batch": row.sub_batch,
                "precision": row.variant.precision,
                "remat": row.variant.remat,
                "lora": row.variant.lora,
                "peak": row.peak,
                "seconds_per_sample": row.seconds_per_sample,
                "probed": row.probed,
                "fits": row.fits,
            }
            for row in plan.rows
        ],
        "recommended": None if plan.recommended is None else list(plan.recommended),
    }
