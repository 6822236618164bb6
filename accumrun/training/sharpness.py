"""The sharpness hook: the top eigenvalue of the training objective's Hessian (:mod:`accumrun.core.hessian`) in
the row of every ``measure_every``-th epoch, beside ``2 / learning rate``, the most a step of plain gradient descent
stays stable under (the cadence ends a call there, so the weights are the epoch's)."""

from __future__ import annotations

import keras

from accumrun.core.hessian import HessianVectorProducts, top_eigenvalue
from accumrun.training.cadence import Cadence
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import Hook

FIGURES = ("sharpness", "sharpness_limit")
"""The columns the hook adds to a measured epoch's row."""


class Sharpness(Hook):
    """Adds ``sharpness`` and ``sharpness_limit`` to the rows of the epochs ``cadence`` measures after; the Lanczos
    start is drawn from ``seed`` and the epoch, so a resumed run measures what the uninterrupted one did."""

    def __init__(
        self, products: HessianVectorProducts, optimizer: keras.optimizers.Optimizer, cadence: Cadence, seed: int
    ) -> None:
        self._products = products
        self._optimizer = optimizer
        self._cadence = cadence
        self._seed = seed

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        if not (ends_call and self._cadence.measures_after(position.epoch)):
            return {}
        sharpness = top_eigenvalue(self._products, self._products.dimension, seed=self._seed + position.epoch)
        rate = float(keras.ops.convert_to_numpy(self._optimizer.learning_rate))
        return {"sharpness": sharpness, "sharpness_limit": 2.0 / rate}
