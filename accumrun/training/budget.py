"""``training.memory_budget``: the run's fixed bytes checked against it, and ``subdivisions: auto`` under it.

Under a budget, ``auto`` measures rather than waits for an out-of-memory error: each candidate's first batch runs in
a fresh process (:func:`accumrun.training.probe.measure_in_fresh_process`), which reports its peak and time per
sample, from the fewest subdivisions up to the first whose peak fits; the fastest that fits is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from accumrun.config.memory_budget import mib
from accumrun.config.schema import Config
from accumrun.core.footprint import Footprint, candidate_subdivisions, footprint
from accumrun.errors import ConfigError
from accumrun.rundir.status import AutoNote, ProbeNote
from accumrun.training.probe import Measured
from accumrun.training.setup import TrainingSetup

Measure = Callable[[Config, int], Measured]
"""Runs a config's first batch with the given subdivisions and measures it."""


def setup_footprint(setup: TrainingSetup) -> Footprint:
    """The fixed bytes of a built setup: its weights, optimizer state, accumulators and input."""
    model = setup.trained.model
    return footprint(
        model,
        setup.trained.optimizer,
        tuple(model.input_shape[1:]),
        setup.fed.batch_size,
        sample_bytes=setup.fed.dataset.dtype.itemsize,
        feed=setup.fed.feed,
    )


def check_budget(setup: TrainingSetup) -> None:
    """ConfigError where ``training.memory_budget`` is smaller than the bytes the run holds at any sub-batch."""
    training = setup.config.training
    budget = training.budget_bytes
    fixed = setup_footprint(setup).fixed(1)
    if budget is not None and budget < fixed:
        raise ConfigError(
            "training.memory_budget",
            f"{training.memory_budget} ({mib(budget)}) is smaller than the run's fixed bytes, {mib(fixed)} "
            "(weights, optimizer state, accumulators and input)",
        )


def describe_probe(probe: Measured, budget: int) -> str:
    """A probe as a startup line: its peak and time per sample, and whether it fits."""
    if probe.peak is None or probe.seconds_per_sample is None:
        return f"memory_budget: subdivisions {probe.subdivisions}: out of memory"
    verdict = "fits" if probe.peak <= budget else "over"
    return (
        f"memory_budget: subdivisions {probe.subdivisions}: peak {mib(probe.peak)}, "
        f"{probe.seconds_per_sample * 1e3:.3f} ms per sample, {verdict}"
    )


def choose_under_budget(
    config: Config, budget: int, batch_size: int, measure: Measure, echo: Callable[[str], None]
) -> AutoNote:
    """Probe the candidate subdivisions of ``config`` (powers of two from the fewest ``max_sub_batch`` allows, and
    the batch size) until one fits ``budget`` bytes; the fastest that fits is the choice. ConfigError: none fits."""
    training = config.training
    start = math.ceil(batch_size / training.max_sub_batch) if training.max_sub_batch else 1
    counts = [s for s in candidate_subdivisions(batch_size, start) if s >= start]
    probes: list[Measured] = []
    for subdivisions in counts:
        probe = measure(config, subdivisions)
        probes.append(probe)
        echo(describe_probe(probe, budget))
        if probe.peak is not None and probe.peak <= budget:
            break
    fitting = [p for p in probes if p.peak is not None and p.peak <= budget and p.seconds_per_sample is not None]
    if not fitting:
        least = min((p for p in probes if p.peak is not None), key=lambda p: p.peak or 0, default=None)
        measured = f"; the least peak measured was {mib(least.peak or 0)}" if least is not None else ""
        raise ConfigError(
            "training.memory_budget",
            f"{mib(budget)}: no subdivisions fit, up to sub-batches of one sample{measured}",
        )
    chosen = min(fitting, key=lambda p: p.seconds_per_sample or 0.0)
    return AutoNote(
        chosen.subdivisions,
        tuple(p.subdivisions for p in probes),
        budget,
        tuple(ProbeNote(p.subdivisions, p.peak, p.seconds_per_sample) for p in probes),
    )
