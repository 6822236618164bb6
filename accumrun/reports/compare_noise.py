"""The gradient noise scale in a comparison's report: each variant's last measured one beside its batch, or why it
has none."""

from __future__ import annotations

from accumrun.rundir.metrics import EpochRow


def noise_scale_lines(variants: list[tuple[str, list[EpochRow]]]) -> list[str]:
    """Where a variant (its name, its rows) measured the gradient noise scale, each variant's last one beside its
    batch, or why it has none (a variant whose batches are one sub-batch on one device cannot measure it); nothing
    where none did."""
    done = [(name, rows) for name, rows in variants if rows]
    if not any("gradient_sq_norm" in row.figures for _, rows in done for row in rows):
        return []
    lines = ["", "gradient noise scale (the last measured):"]
    for name, rows in done:
        measured = [row for row in rows if "gradient_noise_scale" in row.figures]
        last = rows[-1]
        if measured:
            row = measured[-1]
            scale = row.figures["gradient_noise_scale"]
            where = "above" if row.batch_size > scale else "below"
            said = f"~{scale:,.0f} at epoch {row.epoch}; batch {row.batch_size:,} is {where} it"
        elif any("gradient_sq_norm" in row.figures for row in rows):
            said = "n/a: the |G|^2 estimate was never positive"
        elif last.subdivisions * last.replicas == 1:
            said = "not measured: each batch is one sub-batch on one device, so there is no smaller batch to compare"
        else:
            said = "not measured"
        lines.append(f"  {name}: {said}")
    return lines
