"""The Hessian of the training objective, seen through Hessian-vector products accumulated over sub-batches: its
largest eigenvalue (the sharpness) by Lanczos, and its trace by Hutchinson's estimate.

The objective is the one training minimizes (each sample's loss times its weight, plus the regularization, over the
samples' units) with the model in inference mode, so that it is deterministic: no dropout or noise, BatchNorm on
its moving statistics. A Hessian-vector product is the sum over the chunks (sub-batches) of the gradient of
``<grad(chunk share), v>``: exact for the samples measured, at the memory of one chunk's double backward pass, as
the edge-of-stability code (Cohen et al., ICLR 2021) and PyHessian (Yao et al., 2020) compute it in "physical
batches". Nothing here writes a variable, so a measurement moves neither the weights, the optimizer nor the random
draws.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import keras
import numpy as np
import tensorflow as tf

from accumrun.core.losses import Objective, regularization
from accumrun.core.targets import Targets

Chunks = Callable[[], Iterable[tuple[tf.Tensor, Targets]]]
"""A fresh pass over the samples measured, as ``(x, y)`` chunks."""

LANCZOS_TOLERANCE = 1e-6
"""Lanczos stops when the top Ritz pair's residual is this small relative to its value."""


class HessianVectorProducts:
    """``H v`` of ``objective`` over the chunks of ``chunks``, for ``model``'s trainable variables, as flat float64
    vectors."""

    def __init__(self, model: keras.Model, objective: Objective, chunks: Chunks) -> None:
        self._model = model
        self._objective = objective
        self._chunks = chunks
        self._variables = model.trainable_variables
        self._shapes = [tuple(v.shape) for v in self._variables]
        self._sizes = [int(np.prod(shape)) for shape in self._shapes]
        self._chunk_product = tf.function(self._chunk, reduce_retracing=True)
        self._chunk_units = tf.function(lambda y: tf.reduce_sum(objective.units(y)), reduce_retracing=True)
        self._units: tf.Tensor | None = None

    @property
    def dimension(self) -> int:
        """How many numbers the trainable variables hold."""
        return sum(self._sizes)

    def __call__(self, vector: np.ndarray) -> np.ndarray:
        """``H v`` for the flat ``vector``."""
        if self._units is None:
            # The objective's denominator: every real unit of the samples measured.
            self._units = tf.add_n([self._chunk_units(y) for _, y in self._chunks()])
        pieces = np.split(vector, np.cumsum(self._sizes)[:-1])
        dtype = self._objective.dtype
        parts = [tf.constant(p.reshape(shape), dtype) for p, shape in zip(pieces, self._shapes, strict=True)]
        # Summed where the products are made; read once per pass.
        total = [tf.zeros(shape, dtype) for shape in self._shapes]
        for x, y in self._chunks():
            products = self._chunk_product(x, y, parts, self._units)
            total = [t + p for t, p in zip(total, products, strict=True)]
        return np.concatenate([t.numpy().astype(np.float64).ravel() for t in total])

    def _chunk(self, x: tf.Tensor, y: Targets, vector: list[tf.Tensor], units: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                predictions = self._model(x, training=False)
                loss_sum = tf.reduce_sum(self._objective.per_sample_loss(y, predictions))
                if self._model.losses:
                    # As the step counts it: the regularization once per unit of the samples.
                    loss_sum += regularization(self._model, self._objective.dtype) * tf.reduce_sum(
                        self._objective.units(y)
                    )
                share = loss_sum / units
            gradients = inner.gradient(share, self._variables)
            pairs = [(g, v) for g, v in zip(gradients, vector, strict=True) if g is not None]
            projection = tf.add_n([tf.reduce_sum(tf.cast(g, v.dtype) * v) for g, v in pairs])
        products = outer.gradient(projection, self._variables)
        # A variable the loss does not reach has no curvature.
        dtype = self._objective.dtype
        return [
            tf.zeros(v.shape, dtype) if p is None else tf.cast(p, dtype)
            for p, v in zip(products, self._variables, strict=True)
        ]


def top_eigenvalue(
    product: Callable[[np.ndarray], np.ndarray], dimension: int, seed: int, most_iterations: int = 100
) -> float:
    """The largest eigenvalue of the symmetric operator ``product`` on vectors of ``dimension``, by Lanczos with full
    reorthogonalization from a seeded random start, to :data:`LANCZOS_TOLERANCE` (or the best estimate after
    ``most_iterations`` products). The basis is held on the host: up to ``most_iterations`` float64 vectors."""
    rng = np.random.default_rng(seed)
    steps = min(most_iterations, dimension)
    basis = np.empty((steps, dimension))  # one row per Lanczos vector, filled as they come
    basis[0] = _unit(rng.normal(size=dimension))
    alphas: list[float] = []
    betas: list[float] = []
    top = 0.0
    for k in range(steps):
        w = product(basis[k])
        alphas.append(float(w @ basis[k]))
        # Twice against the whole basis: float rounding would otherwise let the top eigenvalue appear again.
        for _ in range(2):
            w -= basis[: k + 1].T @ (basis[: k + 1] @ w)
        ritz_values, ritz_vectors = np.linalg.eigh(np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1))
        top = float(ritz_values[-1])
        beta = float(np.linalg.norm(w))
        # The top Ritz pair's residual is beta times its vector's last component.
        if beta * abs(ritz_vectors[-1, -1]) <= LANCZOS_TOLERANCE * max(abs(top), 1e-30) or beta == 0.0:
            break
        if k + 1 < steps:
            betas.append(beta)
            basis[k + 1] = w / beta
    return top


def hutchinson_trace(
    product: Callable[[np.ndarray], np.ndarray], dimension: int, vectors: int, seed: int | Sequence[int]
) -> tuple[float, float]:
    """The trace of the symmetric operator ``product`` on vectors of ``dimension``, by Hutchinson's estimate: the
    mean of ``v^T H v`` over ``vectors`` (at least 2) Rademacher vectors ``v`` (each entry -1 or +1) drawn from
    ``seed``, and the standard error of that mean. Each vector costs one product."""
    rng = np.random.default_rng(seed)
    quadratics = np.empty(vectors)
    for k in range(vectors):
        v = rng.integers(0, 2, size=dimension) * 2.0 - 1.0
        quadratics[k] = v @ product(v)
    return float(quadratics.mean()), float(quadratics.std(ddof=1) / np.sqrt(vectors))


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)
