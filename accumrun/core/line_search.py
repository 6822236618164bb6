"""The strong-Wolfe line search of Nocedal and Wright (*Numerical Optimization*, 2nd ed., algorithms 3.5 and 3.6),
on a function of the step length alone, ``phi(t) = f(x + t d)``, as L-BFGS (:mod:`accumrun.core.lbfgs`) needs it.

A step ``t`` is accepted when it satisfies the strong Wolfe conditions: sufficient decrease,
``phi(t) <= phi(0) + c1 t phi'(0)``, and curvature, ``|phi'(t)| <= c2 |phi'(0)|``. Algorithm 3.5 grows the step until
it brackets such a point; algorithm 3.6 (zoom) shrinks the bracket by cubic interpolation (equation 3.59),
bisecting where the cubic has no minimizer, lands too near an end, or meets a value that is not finite. Between two
points whose values differ by no more than the objective's rounding, the next step is the zero of the line through
their slopes instead (as Hager and Zhang's secant step): the cubic would read noise.

Why sufficient decrease is tested twice. The objective is a float32 sum, exact to about 1e-7 of its size, so near a
minimum ``phi(t) - phi(0)`` drowns in rounding while ``phi'(t)`` (a sum of gradients) stays accurate. Where the
value has not risen beyond ``NOISE`` of ``|phi(0)|``, a step also passes on Hager and Zhang's approximate test
(2005), ``phi'(t) <= (2 c1 - 1) phi'(0)``: what sufficient decrease says of a quadratic, read from the slopes. Without
it the search stalls wherever float32 cannot see a decrease, far from the minimizer of an ill-conditioned objective.

A value that is not finite (an overflow at a long trial step) counts as too high, so the step shrinks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

Kept = TypeVar("Kept")

SUFFICIENT_DECREASE = 1e-4
"""``c1``, as Nocedal and Wright and ``torch.optim.LBFGS`` take it."""
CURVATURE = 0.9
"""``c2``: 0.9 suits quasi-Newton directions, whose unit step is usually right."""
NOISE = 1e-6
"""How much of ``|phi(0)|`` a value may rise by and still pass the approximate test (Hager and Zhang's epsilon)."""
MOST_EVALUATIONS = 25
"""The most evaluations one search makes (``torch.optim.LBFGS``'s ``max_ls``)."""


@dataclass(frozen=True)
class Point(Generic[Kept]):
    """``phi`` and ``phi'`` at the step ``step``, with what the caller keeps of that evaluation."""

    step: float
    value: float
    slope: float
    kept: Kept

    @property
    def finite(self) -> bool:
        """Whether the value and the slope are finite numbers."""
        return math.isfinite(self.value) and math.isfinite(self.slope)


@dataclass(frozen=True)
class Search(Generic[Kept]):
    """The point a search accepted, and whether it satisfies the (approximate) strong Wolfe conditions. A search
    that ran out of evaluations, or whose bracket shrank below ``tolerance``, returns the low end of its bracket: a
    point that decreases sufficiently and is the lowest such point found, within the objective's rounding
    (``NOISE``); ``start`` when there was none."""

    point: Point[Kept]
    evaluations: int
    satisfied: bool


def strong_wolfe(
    phi: Callable[[float], Point[Kept]],
    start: Point[Kept],
    first_step: float,
    *,
    budget: int = MOST_EVALUATIONS,
    tolerance: float = 0.0,
) -> Search[Kept]:
    """Search along a descent direction (``start.slope < 0``) from ``start`` (step 0), trying ``first_step`` first,
    with at most ``budget`` evaluations of ``phi``; stop zooming once the bracket is shorter than ``tolerance`` (in
    step length).

    Raises:
        ValueError: ``start`` is not a descent direction, or ``budget`` is below 1.
    """
    if not start.slope < 0:
        raise ValueError(f"the line search needs a descent direction; phi'(0) is {start.slope}")
    if budget < 1:
        raise ValueError(f"the line search needs at least one evaluation, got {budget}")
    search = _Search(phi, start, budget, tolerance)
    return search.bracket(first_step)


class _Search(Generic[Kept]):
    def __init__(self, phi: Callable[[float], Point[Kept]], start: Point[Kept], budget: int, tolerance: float):
        self._phi = phi
        self._start = start
        self._budget = budget
        self._tolerance = tolerance
        self._evaluations = 0
        self._noise = NOISE * abs(start.value)

    def bracket(self, step: float) -> Search[Kept]:
        """Algorithm 3.5: longer steps until one brackets an acceptable point, or is one."""
        previous = self._start
        while self._evaluations < self._budget:
            point = self._evaluate(step)
            rose = previous is not self._start and point.value > previous.value + self._noise
            if not self._decreases(point) or rose:
                return self._zoom(previous, point)
            if self._curvature_holds(point):
                return Search(point, self._evaluations, True)
            if point.slope >= 0:
                return self._zoom(point, previous)
            # Still descending: extrapolate, at least a tenth further and at most ten times as far (a bound relative
            # to the last step alone would creep where rounding makes neighbouring points equal).
            step = self._interpolate(previous, point, (1.1 * step, 10 * step))
            previous = point
        return Search(previous, self._evaluations, False)

    def _zoom(self, low: Point[Kept], high: Point[Kept]) -> Search[Kept]:
        """Algorithm 3.6: ``low`` decreases sufficiently and is the lowest such point so far (within ``NOISE``); an
        acceptable point lies between it and ``high``."""
        while self._evaluations < self._budget and abs(high.step - low.step) > self._tolerance:
            left, right = sorted((low.step, high.step))
            margin = 0.1 * (right - left)
            step = self._interpolate(low, high, (left, right)) if high.finite else (left + right) / 2
            if not left + margin <= step <= right - margin:
                step = (left + right) / 2  # too near an end: the bracket would hardly shrink
            point = self._evaluate(step)
            if not self._decreases(point) or point.value > low.value + self._noise:
                high = point
                continue
            if self._curvature_holds(point):
                return Search(point, self._evaluations, True)
            if point.slope * (high.step - low.step) >= 0:
                high = low
            low = point
        return Search(low, self._evaluations, False)

    def _interpolate(self, a: Point[Kept], b: Point[Kept], bounds: tuple[float, float]) -> float:
        """Where the minimum between or beyond ``a`` and ``b`` lies, kept within ``bounds``: the cubic through their
        values and slopes, or, where their values differ by no more than the objective's rounding, the zero of the
        line through their slopes (the values say nothing there; Hager and Zhang's secant step reads the slopes
        alone too)."""
        if abs(a.value - b.value) > self._noise:
            return _cubic_minimizer(a, b, bounds)
        low, high = min(bounds), max(bounds)
        if a.slope == b.slope:
            return (low + high) / 2
        step = b.step - b.slope * (b.step - a.step) / (b.slope - a.slope)
        return min(max(step, low), high) if math.isfinite(step) else (low + high) / 2

    def _evaluate(self, step: float) -> Point[Kept]:
        self._evaluations += 1
        return self._phi(step)

    def _decreases(self, point: Point[Kept]) -> bool:
        """Sufficient decrease, exact or (within the objective's rounding) approximate; never for a value that is
        not finite."""
        start = self._start
        if not point.finite:
            return False
        if point.value <= start.value + SUFFICIENT_DECREASE * point.step * start.slope:
            return True
        approximate = point.slope <= (2 * SUFFICIENT_DECREASE - 1) * start.slope
        return point.value <= start.value + self._noise and approximate

    def _curvature_holds(self, point: Point[Kept]) -> bool:
        return abs(point.slope) <= -CURVATURE * self._start.slope


def _cubic_minimizer(a: Point[Kept], b: Point[Kept], bounds: tuple[float, float]) -> float:
    """The minimizer of the cubic through ``a`` and ``b`` (values and slopes), kept within ``bounds``; their middle
    where the cubic has none."""
    low, high = min(bounds), max(bounds)
    d1 = a.slope + b.slope - 3 * (a.value - b.value) / (a.step - b.step)
    square = d1 * d1 - a.slope * b.slope
    if not (math.isfinite(square) and square >= 0):
        return (low + high) / 2
    d2 = math.copysign(math.sqrt(square), b.step - a.step)
    denominator = b.slope - a.slope + 2 * d2
    if denominator == 0:
        return (low + high) / 2
    step = b.step - (b.step - a.step) * (b.slope + d2 - d1) / denominator
    return min(max(step, low), high) if math.isfinite(step) else (low + high) / 2
