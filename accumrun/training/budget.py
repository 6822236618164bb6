"""``training.memory_budget``: the run's fixed bytes checked against it, and ``subdivisions: auto`` under it.

Under a budget, ``auto`` measures rather than waits for an out-of-memory error: each candidate's first batch runs in
a fresh process (:func:`accumrun.training.probe.measure_in_fresh_process`), which reports its peak and time per
sample, from the fewest subdivisions up to the first whose peak fits, for each remat mode where ``remat`` is
``auto`` too; the fastest (subdivisions, remat) pair that fits is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from accumrun.config.memory_budget import mib
from accumrun.config.schema import Config
from accumrun.core.footprint import Footprint, candidate_subdivisions, footprint
from accumrun.errors import ConfigError
from accumrun.kinds import Remat
from accumrun.models.registry import kind_of
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


def remat_modes(config: Config) -> list[Remat]:
    """The remat modes ``auto`` chooses among, fastest first (every mode the model takes), or the configured one."""
    remat = config.training.remat
    if remat != "auto":
        return [remat]
    has_blocks = kind_of(config.model).blocks is not None
    return [mode for mode in Remat if mode is not Remat.BLOCKS or has_blocks]


def describe_probe(probe: Measured, remat: Remat, budget: int) -> str:
    """A probe as a startup line: its peak and time per sample, and whether it fits."""
    name = f"memory_budget: subdivisions {probe.subdivisions}, remat {remat.value}"
    if probe.peak is None or probe.seconds_per_sample is None:
        return f"{name}: out of memory"
    verdict = "fits" if probe.peak <= budget else "over"
    return f"{name}: peak {mib(probe.peak)}, {probe.seconds_per_sample * 1e3:.3f} ms per sample, {verdict}"


def choose_under_budget(
    config: Config, budget: int, batch_size: int, measure: Measure, echo: Callable[[str], None]
) -> AutoNote:
    """Probe the candidates of ``config`` until one fits ``budget`` bytes, for each remat mode (:func:`remat_modes`),
    and choose the fastest that fits. The subdivisions are the configured ones, or for ``auto`` powers of two from
    the fewest ``max_sub_batch`` allows, and the batch size; a mode that recomputes is slower at the same
    subdivisions, so it is probed only below the fewest that fit so far. ConfigError: none fits."""
    training = config.training
    fixed = training.fixed_subdivisions
    start = fixed or (math.ceil(batch_size / training.max_sub_batch) if training.max_sub_batch else 1)
    counts = [fixed] if fixed else [s for s in candidate_subdivisions(batch_size, start) if s >= start]
    probes: list[tuple[Remat, Measured]] = []
    fewest = batch_size + 1
    for remat in remat_modes(config):
        moded = config.model_copy(update={"training": training.model_copy(update={"remat": remat})})
        for subdivisions in counts if remat is Remat.NONE or fixed else [s for s in counts if s < fewest]:
            probe = measure(moded, subdivisions)
            probes.append((remat, probe))
            echo(describe_probe(probe, remat, budget))
            if probe.peak is not None and probe.peak <= budget:
                fewest = min(fewest, subdivisions)
                break
    fitting = [(r, p) for r, p in probes if p.peak is not None and p.peak <= budget and p.seconds_per_sample]
    if not fitting:
        least = min((p.peak for _, p in probes if p.peak is not None), default=None)
        measured = f"; the least peak measured was {mib(least)}" if least is not None else ""
        raise ConfigError("training.memory_budget", f"{mib(budget)}: no candidate fits{measured}")
    remat, chosen = min(fitting, key=lambda pair: pair[1].seconds_per_sample or 0.0)
    return AutoNote(
        chosen.subdivisions,
        tuple(p.subdivisions for _, p in probes),
        budget,
        tuple(ProbeNote(p.subdivisions, p.peak, p.seconds_per_sample, r.value) for r, p in probes),
        remat.value,
    )
