"""What L-BFGS (:mod:`accumrun.core.lbfgs`) can resolve in the weights' dtype: float32, or float64 under
``training.precision: float64``."""

from __future__ import annotations

import tensorflow as tf

FLOAT32_EPSILON = 2.0**-23
"""The spacing of float32 numbers at 1: the objective, a float32 sum, resolves changes of this much of itself."""
FLOAT64_EPSILON = 2.0**-52
"""The same for float64, whose sums resolve this much."""
CURVATURE_FLOOR = 1e-10
"""A pair whose ``y . s`` is at most this carries no usable curvature, and is not stored (as torch skips it); float32
only (see :func:`curvature_floor`)."""


def epsilon(dtype: tf.DType | str) -> float:
    """The objective's resolution relative to itself, for weights (so sums) of ``dtype``."""
    return FLOAT64_EPSILON if tf.as_dtype(dtype) == tf.float64 else FLOAT32_EPSILON


def curvature_floor(y: tf.Tensor, s: tf.Tensor) -> tf.Tensor:
    """The ``y . s`` a curvature pair must exceed: :data:`CURVATURE_FLOOR` in float32; in float64 only rounding's
    share of ``|y| |s|``, as a fixed floor would drop every pair near the minimum that float64 resolves, and leave
    L-BFGS to steepest descent there."""
    if y.dtype != tf.float64:
        return tf.constant(CURVATURE_FLOOR, tf.float64)
    return FLOAT64_EPSILON * tf.norm(y) * tf.norm(s)
