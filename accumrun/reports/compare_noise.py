"""The gradient noise scale in a comparison's report: each variant's last measured one beside its batch, or why it
has none."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accumrun.reports.compare import Variant


def noise_scale_lines(variants: list[Variant]) -> list[str]:
    """Where a variant measured the gradient noise scale, each variant's last one beside its batch, or why it has
    none (a variant whose batches are one sub-batch on one device cannot measure it); nothing where none did."""
    done = [v for v in variants if v.metrics]
    if not any("gradient_sq_norm" in row.figures for v in done for row in v.metrics):
        return []
    lines = ["", "gradient noise scale (the last measured):"]
    for v in done:
        measured = [row for row in v.metrics if "gradient_noise_scale" in row.figures]
        last = v.metrics[-1]
        if measured:
            row = measured[-1]
            scale = row.figures["gradient_noise_scale"]
            where = "above" if row.batch_size > scale else "below"
            said = f"~{scale:,.0f} at epoch {row.epoch}; batch {row.batch_size:,} is {where} it"
        elif any("gradient_sq_norm" in row.figures for row in v.metrics):
            said = "n/a: the |G|^2 estimate was never positive"
        elif last.subdivisions * last.replicas == 1:
            said = "not measured: each batch is one sub-batch on one device, so there is no smaller batch to compare"
        else:
            said = "not measured"
        lines.append(f"  {v.name}: {said}")
    return lines
