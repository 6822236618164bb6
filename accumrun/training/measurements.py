"""The measurements of ``training.measure``, by name: one module each, registered here once. Everything else asks
this table (:func:`measurement_observers`, :func:`measurement_hooks`, ...), never a measurement by name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import tensorflow as tf

from accumrun.config.schema import TrainingConfig
from accumrun.core.observers import Observer, Observers
from accumrun.kinds import Measure
from accumrun.training import hessian_trace, noise_scale, sharpness
from accumrun.training.hooks import Hook
from accumrun.training.measurement import Measurement, Measuring

MEASUREMENTS: dict[Measure, Measurement] = {
    Measure.NOISE_SCALE: noise_scale.MEASUREMENT,
    Measure.SHARPNESS: sharpness.MEASUREMENT,
    Measure.HESSIAN_TRACE: hessian_trace.MEASUREMENT,
}


def measurement_observers(training: TrainingConfig, updates: tf.Variable) -> tuple[Observer, ...]:
    """The observers the step runs for ``training.measure``, in their order; ``updates`` counts the updates."""
    return tuple(
        observer(training, updates)
        for measure in training.measure
        if (observer := MEASUREMENTS[measure].observer) is not None
    )


def measurement_notes(training: TrainingConfig, observers: Observers) -> list[str]:
    """What ``check`` says of the measurements of ``training.measure``, given the ``observers`` the step runs."""
    notes = []
    for measure in training.measure:
        declared = MEASUREMENTS[measure]
        observer = declared.observer
        runs = observer is None or observers.columns(str(measure)) is not None
        if declared.note is not None and (note := declared.note(training, runs)) is not None:
            notes.append(note)
    return notes


def measurement_hooks(measures: Iterable[Measure], measuring: Measuring) -> list[Hook]:
    """The hooks of ``measures``, in their order."""
    return [MEASUREMENTS[measure].hook(measuring) for measure in measures]


def measured_periodically(measures: Iterable[Measure]) -> bool:
    """Whether any of ``measures`` is measured after every ``measure_every``-th epoch."""
    return any(MEASUREMENTS[measure].periodic for measure in measures)


def measurement_lines(figures: Mapping[str, float]) -> list[str]:
    """The parts of an epoch's console line that the measurements in ``figures`` write, in the table's order."""
    return [part for m in MEASUREMENTS.values() if m.line is not None and (part := m.line(figures)) is not None]
