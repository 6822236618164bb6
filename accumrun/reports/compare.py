"""Subdivisions on vs off, or any other key: the same config trained under several values of one key, side by
side.

Each variant is a separate ``accumrun train`` process, so that its peak memory is its own, and a run folder of
its own. All variants share the seed, hence the initial weights and every epoch's data order; only the varied key
(by default ``training.subdivisions``) differs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accumrun.errors import ConfigError, DataError
from accumrun.kinds import BatchNormMode, RunState
from accumrun.reports.plot import plot_curves
from accumrun.rundir.atomic import write_text_atomically
from accumrun.rundir.metrics import EpochRow, load_metrics, read_rows
from accumrun.rundir.status import BatchNormNote, RunRecord

SUBDIVISIONS = "training.subdivisions"
"""The key a comparison varies unless told another."""


@dataclass
class Variant:
    """One trained variant: its value of the varied key, where it ran, and how it went."""

    value: int | str
    """A subdivision count or ``auto`` (the variant settles it and records the count in its metrics rows), or the
    value of ``key``, as ``--set`` takes it."""
    run_dir: Path
    key: str = SUBDIVISIONS
    exit_code: int | None = None
    """The variant's ``accumrun train`` exit code; None until it has run."""
    error: str | None = None
    metrics: list[EpochRow] = field(default_factory=list)
    max_weight_difference: float | None = None
    batch_norm: BatchNormNote | None = None
    """The model's BatchNorm layers and mode, when it has some (from the variant's ``run.json``)."""

    @property
    def completed(self) -> bool:
        return self.exit_code == 0

    @property
    def status(self) -> str:
        """``pending``, ``completed`` or ``failed (exit N)``, as the table and ``compare.json`` show it."""
        if self.exit_code is None:
            return "pending"
        return RunState.COMPLETED.value if self.completed else f"failed (exit {self.exit_code})"

    @property
    def short(self) -> str:
        """The variant in a column heading: ``S=4``, or the value of another key."""
        return f"S={self.value}" if self.key == SUBDIVISIONS else str(self.value)

    @property
    def name(self) -> str:
        """``subdivisions 4``, ``off (subdivisions 1)`` or ``optimizer.name=sgd``."""
        if self.key != SUBDIVISIONS:
            return f"{self.key}={self.value}"
        return "off (subdivisions 1)" if self.value == 1 else f"subdivisions {self.value}"

    @property
    def label(self) -> str:
        name = self.name
        if self.key == SUBDIVISIONS and self.value == "auto" and self.metrics:
            name += f" ({self.metrics[-1].subdivisions})"
        if not self.metrics:
            return f"{name}: {self.status}"
        seconds, rss = _median_seconds(self.metrics), max(row.peak_rss_mib for row in self.metrics)
        return f"{name}: {seconds:.2f} s/epoch, peak {rss:,.0f} MiB RSS"

    def to_json(self) -> dict[str, Any]:
        """The variant as ``compare.json`` lists it, its rows as ``metrics.jsonl`` holds them."""
        batch_norm = self.batch_norm
        varied = {"subdivisions": self.value} if self.key == SUBDIVISIONS else {}
        return {
            **varied,
            "key": self.key,
            "value": self.value,
            "run_dir": str(self.run_dir),
            "status": self.status,
            "error": self.error,
            "metrics": [row.to_json() for row in self.metrics],
            "max_weight_difference": self.max_weight_difference,
            "batch_norm": {"layers": batch_norm.layers, "mode": batch_norm.mode.value} if batch_norm else None,
            "label": self.label,
        }


@dataclass
class Comparison:
    """What ``compare`` did: the variants, and the report files it wrote."""

    variants: list[Variant]
    json_path: Path
    png_path: Path | None

    @property
    def failed(self) -> list[Variant]:
        return [v for v in self.variants if not v.completed]

    def table(self) -> str:
        """The per-epoch and per-variant tables (see :func:`format_table`)."""
        return format_table(self.variants)


def compare_runs(
    config_path: Path,
    values: list[int | str],
    out_dir: Path,
    overrides: list[str],
    *,
    echo: Callable[[str], None],
    key: str = SUBDIVISIONS,
) -> Comparison:
    """Train ``config_path`` once per value of ``key`` into ``out_dir/subdivisions-N`` (or ``out_dir/KEY-VALUE``;
    ``out_dir`` must be empty or new; a failed variant does not stop the rest), then write ``compare.json`` there,
    and ``compare.png`` when some variant has metrics: :func:`accumrun.compare`."""
    if out_dir.exists() and any(out_dir.iterdir()):
        # Exit 1, as train and export refuse an occupied output: the folder, not the command line, is at fault.
        raise ConfigError("run_dir", "exists and is not empty; choose another", str(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = []
    subdivisions = key == SUBDIVISIONS
    for value in values:
        variant = Variant(value, out_dir / f"{'subdivisions' if subdivisions else key}-{value}", key)
        echo(f"== training with {variant.name} -> {variant.run_dir}")
        command = [sys.executable, "-m", "accumrun", "train", str(config_path), "--quiet"]
        command += [arg for override in overrides for arg in ("--set", override)]
        command += ["--subdivisions", str(value)] if subdivisions else ["--set", f"{key}={value}"]
        command += ["--run-dir", str(variant.run_dir)]
        # stderr is captured to report the failure; a crash of one variant must not end the comparison.
        finished = subprocess.run(command, stderr=subprocess.PIPE, text=True)
        variant.exit_code = finished.returncode
        if variant.completed:
            variant.metrics = read_rows(variant.run_dir)
            record = RunRecord.read(variant.run_dir)
            variant.batch_norm = record.batch_norm if record is not None else None
        else:
            lines = [line for line in finished.stderr.strip().splitlines() if line.strip()]
            variant.error = lines[-1].removeprefix("Error: ") if lines else "no error message"
            echo(f"   failed: {variant.error}")
        variants.append(variant)
    _fill_weight_differences(variants)
    report = {"config": str(config_path), "variants": [v.to_json() for v in variants]}
    json_path = write_text_atomically(out_dir / "compare.json", json.dumps(report, indent=2) + "\n")
    curves = {v.label: [row.to_json() for row in v.metrics] for v in variants if v.metrics}
    title = f"{config_path.name}: {'subdivisions' if subdivisions else key} compared"
    png_path = plot_curves(curves, out_dir / "compare.png", title=title) if curves else None
    return Comparison(variants, json_path, png_path)


def compared_curves(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """The metrics rows of each variant of the comparison in ``folder`` (by its ``compare.json``) that has some,
    under the variant's name (``subdivisions 4``, ``optimizer.name=sgd``): what ``accumrun plot`` draws of it. A
    variant's rows are read from its run folder's ``metrics.jsonl``, so a variant resumed since is drawn whole."""
    try:
        listed = json.loads((folder / "compare.json").read_text())["variants"]
        # Variants are the comparison folder's children; compare.json's path may be relative to another folder.
        variants = [Variant(entry["value"], folder / Path(entry["run_dir"]).name, entry["key"]) for entry in listed]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(str(folder / "compare.json"), f"cannot be read as a comparison: {error}") from None
    curves = {}
    for variant in variants:
        if (variant.run_dir / "metrics.jsonl").is_file():
            curves[variant.name] = load_metrics(variant.run_dir)
    if not curves:
        raise DataError(str(folder), "no variant of this comparison has metrics to plot")
    return curves


def _fill_weight_differences(variants: list[Variant]) -> None:
    """Largest absolute difference of every final weight (BatchNorm statistics included) to the first variant."""
    done = [v for v in variants if v.completed]
    if len(done) < 2:
        return
    import keras

    reference = keras.models.load_model(done[0].run_dir / "model.keras", compile=False).get_weights()
    done[0].max_weight_difference = 0.0
    for variant in done[1:]:
        own = keras.models.load_model(variant.run_dir / "model.keras", compile=False).get_weights()
        if [w.shape for w in own] != [w.shape for w in reference]:
            continue  # another model: no weight to compare
        variant.max_weight_difference = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, own, strict=True))


def format_table(variants: list[Variant]) -> str:
    """Per-epoch losses of each variant and their difference to the first, then a summary per variant."""
    done = [v for v in variants if v.metrics]
    lines = []
    if done:
        header = ["epoch", *(f"{what} {v.short}" for v in done for what in ("loss", "val"))]
        if len(done) > 1:
            header += ["max |d loss|", "max |d val|"]
        lines.append(" | ".join(f"{h:>13}" for h in header))
        for index in range(max(len(v.metrics) for v in done)):
            rows = [v.metrics[index] if index < len(v.metrics) else None for v in done]
            cells = [f"{index + 1:>13}"]
            for row in rows:
                cells += [_number(row.loss if row else None), _number(row.figures.get("val_loss") if row else None)]
            if len(done) > 1:
                cells += [_spread(rows, "loss"), _spread(rows, "val_loss")]
            lines.append(" | ".join(cells))
        lines.append("")
    varied = variants[0].key.removeprefix("training.") if variants else "subdivisions"
    columns = [varied, "s/epoch", "samples/s", "peak RSS MiB", "peak GPU MiB", "max |d weight|"]
    lines.append(" | ".join(f"{h:>14}" for h in columns) + " | status")
    for v in variants:
        cells = [str(v.value)] + ["-"] * 5
        if v.metrics:
            gpu, weights = v.metrics[-1].peak_device_mib is not None, v.max_weight_difference
            cells[1:] = [
                f"{_median_seconds(v.metrics):.2f}",
                f"{statistics.median(r.samples_per_second for r in v.metrics):,.0f}",
                f"{max(r.peak_rss_mib for r in v.metrics):,.0f}",
                f"{max(r.peak_device_mib or 0.0 for r in v.metrics):,.0f}" if gpu else "-",
                f"{weights:.2e}" if weights is not None else "-",
            ]
        error = f": {v.error}" if v.error else ""
        lines.append(" | ".join(f"{cell:>14}" for cell in cells) + f" | {v.status}{error}")
    lines += noise_scale_lines(variants)
    batch_norm = next((v.batch_norm for v in variants if v.batch_norm), None)
    subdivided = bool(variants) and variants[0].key == SUBDIVISIONS  # other keys' variants differ by design
    if subdivided and batch_norm is not None and batch_norm.mode is not BatchNormMode.FROZEN:
        lines.append(
            f"\nnote: the model has {batch_norm.layers} BatchNorm layers (batch_norm: {batch_norm.mode.value}); each "
            "sub-batch is normalized with its own statistics, so the variants are not expected to match (batch_norm: "
            "frozen makes them match)"
        )
    return "\n".join(lines)


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


def _median_seconds(rows: list[EpochRow]) -> float:
    """The median epoch time, leaving out the first (which includes tracing) when there are others."""
    return statistics.median(r.seconds for r in rows[1:] or rows)


def _number(value: float | None) -> str:
    return f"{value:>13.6f}" if value is not None else f"{'-':>13}"


def _spread(rows: list[EpochRow | None], key: str) -> str:
    values = [r.figure(key) for r in rows if r is not None and (key == "loss" or key in r.figures)]
    return f"{max(values) - min(values):>13.2e}" if len(values) > 1 else f"{'-':>13}"
