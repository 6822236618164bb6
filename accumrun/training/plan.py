"""``accumrun plan``: each candidate's peak memory and speed, before a run.

The fixed bytes come from arithmetic (:mod:`accumrun.core.footprint`, as ``check --memory``'s). Each variant (a
precision, and whatever else the probes must hold fixed) is probed in fresh processes
(:func:`accumrun.training.probe.measure_in_fresh_process`) at three sub-batch sizes: the largest that does not run out
of memory, the smallest, and one between (their geometric mean). What they hold above the fixed bytes grows with the
sub-batch, in a line between each two (the activations per sample, the slope; the runtime's own bytes, what is left
at none), so every candidate's peak is predicted, not only the probed ones'. Three, not two: a CPU's peak resident
size was not one line in the sub-batch here (``docs/benchmarks-plan.md``).
Time per sample is the probes', and a piecewise line in the subdivisions between them.
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
    def remat(self) -> str:
        """The variant's ``training.remat`` (``auto`` is ``none`` in a probe without a budget)."""
        remat = self.config.training.remat
        return remat if isinstance(remat, str) else remat.value

    @property
    def lora(self) -> str | None:
        """The variant's LoRA, as ``rank 8`` (``, int8`` on a quantized base); None without ``model.lora``."""
        model = self.config.model
        if model.lora is None:
            return None
        return f"rank {model.lora.rank}" + (f", {model.quantize}" if model.quantize else "")


@dataclass(frozen=True)
class Fitted:
    """A variant's probes, and what their peaks hold above the fixed bytes."""

    variant: Variant
    probes: tuple[Measured, ...]
    above: tuple[tuple[int, float], ...]
    """(sub-batch, peak less the fixed bytes) of each probe that fitted, by sub-batch: the peak between two of them is
    read off the line that joins them, and beyond the ends off the end segments."""
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
    """Probe from the fewest subdivisions up to the first that does not run out of memory, then the most (the
    smallest sub-batch) and the one between whose sub-batch is nearest their geometric mean."""
    probes: list[Measured] = []
    for subdivisions in candidates:
        probes.append(measure(config, subdivisions))
        if not probes[-1].out_of_memory:
            break
    first = probes[-1].subdivisions
    rest = [s for s in candidates if s > first]
    if probes[-1].out_of_memory or not rest:
        return probes
    middle = math.sqrt(math.ceil(batch_size / first) * math.ceil(batch_size / rest[-1]))
    between = min(rest[:-1], key=lambda s: abs(math.log(math.ceil(batch_size / s) / middle)), default=None)
    for subdivisions in ([between] if between is not None else []) + [rest[-1]]:
        probes.append(measure(config, subdivisions))
    return probes


def _between(points: Sequence[tuple[float, float]], x: float) -> float:
    """The piecewise line through ``points`` (sorted by their first value) at ``x``, its end segments extended."""
    if len(points) == 1:
        return points[0][1]
    index = next((i for i in range(1, len(points) - 1) if x < points[i][0]), len(points) - 1)
    (x1, y1), (x2, y2) = points[index - 1], points[index]
    return y1 + (y2 - y1) * (x - x1) / (x2 - x1)


def fit(variant: Variant, probes: Sequence[Measured], fixed: Footprint) -> Fitted:
    """The probes' peaks above the fixed bytes, by sub-batch: the activations per sample are the slope between the
    two largest sub-batches, the runtime's bytes what the line through the two smallest leaves at none."""
    above = sorted(
        (
            math.ceil(fixed.batch_size / p.subdivisions),
            p.peak - fixed.fixed(math.ceil(fixed.batch_size / p.subdivisions)),
        )
        for p in probes
        if p.peak is not None
    )
    if not above:
        return Fitted(variant, tuple(probes), (), math.nan, math.nan)
    if len(above) == 1:
        return Fitted(variant, tuple(probes), ((0, 0.0), *above), above[0][1] / above[0][0], 0.0)
    (b1, a1), (b2, a2) = above[-2:]
    return Fitted(variant, tuple(probes), tuple(above), (a2 - a1) / (b2 - b1), _between(above, 0))


def _seconds(probes: Sequence[Measured], subdivisions: int) -> float | None:
    """The measured time per sample, or the piecewise line in the subdivisions through the probes (at least their
    least)."""
    timed = sorted((p.subdivisions, p.seconds_per_sample) for p in probes if p.seconds_per_sample is not None)
    if not timed:
        return None
    return max(min(t for _, t in timed), _between(timed, subdivisions))


def rows_of(fitted: Fitted, fixed: Footprint, candidates: list[int], budget: int | None) -> list[Row]:
    """A row per candidate subdivisions under the fitted variant."""
    failed = [p.subdivisions for p in fitted.probes if p.out_of_memory]
    rows = []
    for subdivisions in candidates:
        sub_batch = math.ceil(fixed.batch_size / subdivisions)
        peak = fixed.fixed(sub_batch) + _between(fitted.above, sub_batch) if fitted.above else None
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
