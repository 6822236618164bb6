"""``accumrun plan``: each candidate's peak memory and speed, before a run.

The fixed bytes come from arithmetic (:mod:`accumrun.core.footprint`, as ``check --memory``'s). Each variant (a
precision, and whatever else the probes must hold fixed) is probed in fresh processes
(:func:`accumrun.training.probe.measure_in_fresh_process`) at two sub-batch sizes: the largest that does not run out of
memory, and one about an eighth of it. The peak is a line in the sub-batch: what the two probes hold above the fixed
bytes gives the activations per sample (the slope) and the runtime's own bytes (the rest), so every candidate's peak
is predicted, not only the probed ones'. Time per sample is the probes', and a line in the subdivisions between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import yaml

from accumrun.config.loading import load_config
from accumrun.config.schema import Config
from accumrun.core.footprint import Footprint, candidate_subdivisions
from accumrun.training.probe import Measured

Measure = Callable[[Config, int], Measured]
"""Runs a config's first batch with the given subdivisions and measures it."""


@dataclass(frozen=True)
class Variant:
    """What a variant's probes hold fixed, as the ``--set`` overrides that make it from the config."""

    overrides: tuple[str, ...]
    config: Config

    @property
    def precision(self) -> str:
        """The variant's ``training.precision``."""
        return self.config.training.precision.value

    @property
    def lora(self) -> str | None:
        """The variant's LoRA, as ``rank 8`` (``, int8`` on a quantized base); None without ``model.lora``."""
        model = self.config.model
        if model.lora is None:
            return None
        return f"rank {model.lora.rank}" + (f", {model.quantize}" if model.quantize else "")


@dataclass(frozen=True)
class Fitted:
    """A variant's probes, and the line through their peaks above the fixed bytes."""

    variant: Variant
    probes: tuple[Measured, ...]
    activations_per_sample: float
    runtime: float
    """The bytes the probes hold beyond the fixed ones and the activations: the runtime's own, the traced step."""


@dataclass(frozen=True)
class Row:
    """One candidate: its subdivisions under a variant, its predicted peak and time per sample, and whether it fits."""

    variant: Variant
    subdivisions: int
    sub_batch: int
    peak: float | None
    """Predicted bytes; None where the variant's probes ran out of memory at every size."""
    seconds_per_sample: float | None
    probed: bool
    fits: bool | None
    """Against the budget (None without one); a candidate at or above a sub-batch that ran out of memory never fits."""


@dataclass(frozen=True)
class Plan:
    """The fixed bytes, each variant's fitted line, a row per candidate, and the recommended overrides."""

    footprint: Footprint
    budget: int | None
    fitted: tuple[Fitted, ...]
    rows: tuple[Row, ...]
    recommended: tuple[str, ...] | None
    """The ``--set`` overrides of the fastest candidate that fits; None when none does."""


def variants(config: Config, axes: Sequence[tuple[str, Sequence[str]]]) -> list[Variant]:
    """The config under every combination of the axes' values (each a config key and its values; a key with no
    values keeps the config's), validated as ``--set`` would be: a refused one is a ConfigError."""
    raw = yaml.safe_load(config.to_yaml())
    combinations: list[tuple[str, ...]] = [()]
    for key, values in axes:
        if values:
            combinations = [(*made, f"{key}={value}") for made in combinations for value in values]
    return [Variant(overrides, load_config(raw, overrides)) for overrides in combinations]


def _probe_sizes(candidates: list[int], batch_size: int, config: Config, measure: Measure) -> list[Measured]:
    """Probe from the fewest subdivisions up to the first that does not run out of memory, then one whose sub-batch
    is about an eighth of that one's."""
    probes: list[Measured] = []
    for subdivisions in candidates:
        probes.append(measure(config, subdivisions))
        if not probes[-1].out_of_memory:
            break
    if probes[-1].out_of_memory:
        return probes
    first = probes[-1].subdivisions
    target = max(1, math.ceil(batch_size / first) // 8)
    smaller = [s for s in candidates if s > first and math.ceil(batch_size / s) >= target]
    if smaller:
        probes.append(measure(config, smaller[-1]))
    return probes


def fit(variant: Variant, probes: Sequence[Measured], fixed: Footprint) -> Fitted:
    """The line through the probes' peaks above the fixed bytes, in the sub-batch (through zero with one probe)."""
    points = [(math.ceil(fixed.batch_size / p.subdivisions), p.peak) for p in probes if p.peak is not None]
    above = [(b, peak - fixed.fixed(b)) for b, peak in points]
    if len(above) >= 2:
        (b1, a1), (b2, a2) = above[-2], above[-1]
        slope = (a1 - a2) / (b1 - b2)
        return Fitted(variant, tuple(probes), slope, a1 - slope * b1)
    if above:
        return Fitted(variant, tuple(probes), above[0][1] / above[0][0], 0.0)
    return Fitted(variant, tuple(probes), math.nan, math.nan)


def _seconds(probes: Sequence[Measured], subdivisions: int) -> float | None:
    """The measured time per sample, or the line in the subdivisions through the probes (at least their least)."""
    timed = [(p.subdivisions, p.seconds_per_sample) for p in probes if p.seconds_per_sample is not None]
    for probed, seconds in timed:
        if probed == subdivisions:
            return seconds
    if len(timed) < 2:
        return timed[0][1] if timed else None
    (s1, t1), (s2, t2) = timed[-2], timed[-1]
    return max(min(t1, t2), t1 + (t2 - t1) * (subdivisions - s1) / (s2 - s1))


def rows_of(fitted: Fitted, fixed: Footprint, candidates: list[int], budget: int | None) -> list[Row]:
    """A row per candidate subdivisions under the fitted variant."""
    failed = [p.subdivisions for p in fitted.probes if p.out_of_memory]
    rows = []
    for subdivisions in candidates:
        sub_batch = math.ceil(fixed.batch_size / subdivisions)
        known = not math.isnan(fitted.activations_per_sample)
        peak = fixed.fixed(sub_batch) + fitted.runtime + fitted.activations_per_sample * sub_batch if known else None
        too_large = any(subdivisions <= s for s in failed)
        fits = None if budget is None else (peak is not None and peak <= budget and not too_large)
        probed = any(p.subdivisions == subdivisions for p in fitted.probes)
        seconds = None if too_large else _seconds(fitted.probes, subdivisions)
        rows.append(Row(fitted.variant, subdivisions, sub_batch, peak, seconds, probed, fits))
    return rows


def make_plan(
    config: Config,
    fixed: Footprint,
    budget: int | None,
    axes: Sequence[tuple[str, Sequence[str]]],
    measure: Measure,
    echo: Callable[[str], None],
) -> Plan:
    """Probe each variant of ``config`` (:func:`variants`) and predict every candidate; ``fixed`` is the configured
    run's footprint."""
    candidates = candidate_subdivisions(fixed.batch_size, config.training.fixed_subdivisions)
    fitted, rows = [], []
    for variant in variants(config, axes):
        echo(f"probing {' '.join(variant.overrides) or 'the config'} in fresh processes")
        one = fit(variant, _probe_sizes(candidates, fixed.batch_size, variant.config, measure), fixed)
        fitted.append(one)
        rows.extend(rows_of(one, fixed, candidates, budget))
    usable = [r for r in rows if r.seconds_per_sample is not None and r.fits is not False]
    best = min(usable, key=lambda r: r.seconds_per_sample or 0.0, default=None)
    recommended = None
    if best is not None:
        recommended = (f"training.subdivisions={best.subdivisions}", *best.variant.overrides)
    return Plan(fixed, budget, tuple(fitted), tuple(rows), recommended)
