"""The sharpness hook: the top eigenvalue of the training objective's Hessian (:mod:`accumrun.core.hessian`) in
the row of every ``measure_every``-th epoch, beside the most a step of the optimizer stays stable under, where it
has such a limit (the cadence ends a call there, so the weights are the epoch's)."""

from __future__ import annotations

from collections.abc import Mapping

import keras

from accumrun.core.hessian import top_eigenvalue
from accumrun.training.checkpoints import Position
from accumrun.training.measurement import Measurement, Periodic


class Sharpness(Periodic):
    """Adds ``sharpness`` and, for gradient descent, ``sharpness_limit`` (:func:`stability_limit`) to the rows of the
    epochs the cadence measures after; the Lanczos start is drawn from the seed and the epoch, so a resumed run
    measures what the uninterrupted one did."""

    def measure(self, position: Position) -> dict[str, float]:
        products, optimizer = self._measuring.products, self._measuring.optimizer
        sharpness = top_eigenvalue(products, products.dimension, seed=self._measuring.seed + position.epoch)
        limit = stability_limit(optimizer)
        return {"sharpness": sharpness} if limit is None else {"sharpness": sharpness, "sharpness_limit": limit}


def stability_limit(optimizer: keras.optimizers.Optimizer) -> float | None:
    """The largest sharpness under which ``optimizer``'s step is stable on a quadratic, at its current learning rate
    η: 2/η for plain gradient descent, (2 + 2β)/η with heavy-ball momentum β, (2 + 2β)/((1 + 2β)η) with Nesterov's
    (Cohen et al., 2021). None for an adaptive optimizer (Adam, RMSprop, ...), whose step has no such limit."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a loss-scale optimizer's own
    if not isinstance(inner, keras.optimizers.SGD):
        return None
    rate, momentum = float(keras.ops.convert_to_numpy(inner.learning_rate)), float(inner.momentum)
    return (2 + 2 * momentum) / ((1 + 2 * momentum) * rate if inner.nesterov else rate)


def _line(figures: Mapping[str, float]) -> str | None:
    if "sharpness" not in figures:
        return None
    limit = figures.get("sharpness_limit")
    return f"sharpness {figures['sharpness']:.4g}" + (f" (limit {limit:.4g})" if limit else "")


MEASUREMENT = Measurement(hook=Sharpness, periodic=True, line=_line)
"""The sharpness (``sharpness``, ``sharpness_limit``)."""
