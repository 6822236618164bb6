"""The measurements of ``training.measure``, by name: one module each, registered here once. Everything else asks
this table (:func:`measurement_observers`, :func:`measurement_hooks`, ...), never a measurement by name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from accumrun.core.observers import Observer
from accumrun.kinds import Measure
from accumrun.training import hessian_trace, noise_scale, sharpness
from accumrun.training.hooks import Hook
from accumrun.training.measurement import Measurement, Measuring

MEASUREMENTS: dict[Measure, Measurement] = {
    Measure.NOISE_SCALE: noise_scale.MEASUREMENT,
    Measure.SHARPNESS: sharpness.MEASUREMENT,
    Measure.HESSIAN_TRACE: hessian_trace.MEASUREMENT,
}


def measurement_observers(measures: Iterable[Measure]) -> tuple[Observer, ...]:
    """The observers the step runs for ``measures``, in their order."""
    return tuple(observer() for measure in measures if (observer := MEASUREMENTS[measure].observer) is not None)


def measurement_hooks(measures: Iterable[Measure], measuring: Measuring) -> list[Hook]:
    """The hooks of ``measures``, in their order."""
    return [MEASUREMENTS[measure].hook(measuring) for measure in measures]


def measured_periodically(measures: Iterable[Measure]) -> bool:
    """Whether any of ``measures`` is measured after every ``measure_every``-th epoch."""
    return any(MEASUREMENTS[measure].periodic for measure in measures)


def measurement_lines(figures: Mapping[str, float]) -> list[str]:
    """The parts of an epoch's console line that the measurements in ``figures`` write, in the table's order."""
    return [part for m in MEASUREMENTS.values() if m.line is not None and (part := m.line(figures)) is not None]
