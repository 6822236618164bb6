"""The Hessian's trace: Hutchinson's estimate (:func:`accumrun.core.hessian.hutchinson_trace`) of the training
objective's Hessian trace, with the sharpness' Hessian-vector products, in the row of every ``measure_every``-th
epoch beside its standard error. The random vectors are drawn from the run's seed and the update's index, so the
same update measures the same, whatever the subdivisions, and in a resumed run."""

from __future__ import annotations

from collections.abc import Mapping

import keras

from accumrun.core.hessian import HessianVectorProducts, hutchinson_trace
from accumrun.training.cadence import Cadence
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import Hook
from accumrun.training.measurement import Measurement, Measuring


class HessianTrace(Hook):
    """Adds ``hessian_trace`` and ``hessian_trace_error`` (the standard error of its mean over ``vectors`` random
    vectors) to the rows of the epochs ``cadence`` measures after."""

    def __init__(
        self,
        products: HessianVectorProducts,
        optimizer: keras.optimizers.Optimizer,
        cadence: Cadence,
        *,
        seed: int,
        vectors: int,
    ) -> None:
        self._products = products
        self._optimizer = optimizer
        self._cadence = cadence
        self._seed = seed
        self._vectors = vectors

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        if not (ends_call and self._cadence.measures_after(position.epoch)):
            return {}
        update = int(self._optimizer.iterations.numpy())
        trace, error = hutchinson_trace(
            self._products, self._products.dimension, self._vectors, seed=[self._seed, update]
        )
        return {"hessian_trace": trace, "hessian_trace_error": error}


def _hook(measuring: Measuring) -> HessianTrace:
    vectors = measuring.training.trace_vectors
    return HessianTrace(
        measuring.products, measuring.optimizer, measuring.cadence, seed=measuring.seed, vectors=vectors
    )


def _line(figures: Mapping[str, float]) -> str | None:
    if "hessian_trace" not in figures:
        return None
    return f"hessian trace {figures['hessian_trace']:.4g} (error {figures['hessian_trace_error']:.2g})"


MEASUREMENT = Measurement(hook=_hook, periodic=True, line=_line)
"""Hutchinson's estimate of the Hessian's trace (``hessian_trace``, ``hessian_trace_error``)."""
