"""The Hessian's trace: Hutchinson's estimate (:func:`accumrun.core.hessian.hutchinson_trace`) of the training
objective's Hessian trace, with the sharpness' Hessian-vector products, in the row of every ``measure_every``-th
epoch beside its standard error. The random vectors are drawn from the run's seed and the update's index, so the
same update measures the same, whatever the subdivisions, and in a resumed run."""

from __future__ import annotations

from collections.abc import Mapping

from accumrun.core.hessian import hutchinson_trace
from accumrun.training.checkpoints import Position
from accumrun.training.measurement import Measurement, Periodic


class HessianTrace(Periodic):
    """Adds ``hessian_trace`` and ``hessian_trace_error`` (the standard error of its mean over ``trace_vectors``
    random vectors) to the rows of the epochs the cadence measures after."""

    def measure(self, position: Position) -> dict[str, float]:
        measuring = self._measuring
        update = int(measuring.optimizer.iterations.numpy())
        products, vectors = measuring.products, measuring.training.trace_vectors
        trace, error = hutchinson_trace(products, products.dimension, vectors, seed=[measuring.seed, update])
        return {"hessian_trace": trace, "hessian_trace_error": error}


def _line(figures: Mapping[str, float]) -> str | None:
    if "hessian_trace" not in figures:
        return None
    return f"hessian trace {figures['hessian_trace']:.4g} (error {figures['hessian_trace_error']:.2g})"


MEASUREMENT = Measurement(hook=HessianTrace, periodic=True, line=_line)
"""Hutchinson's estimate of the Hessian's trace (``hessian_trace``, ``hessian_trace_error``)."""
