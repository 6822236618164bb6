"""Full-batch L-BFGS (Nocedal and Wright, algorithm 7.5, with the two-loop recursion of algorithm 7.4) on the exact
gradient that the train step accumulates over sub-batches.

How it meets the train step. :class:`Lbfgs` is a Keras optimizer whose "update" keeps the batch's gradient (summed
over the replicas, as Keras sums it for any optimizer) and moves no weight. So one call of the ordinary step, on
the full batch, is one evaluation of the objective and its gradient at the current weights, through the same
sub-batch accumulation, feeds, replicas and weights as any training. :meth:`Lbfgs.iterate` drives the evaluations:
it sets the weights to each trial point of the line search (:mod:`accumrun.core.line_search`) and calls back.

Its state is the optimizer's variables, checkpointed like Adam's slots: the curvature pairs (``history`` of them,
a ring), the gradient and objective at the current weights, and the counts. ``iterations`` counts accepted steps,
so a resumed run continues exactly. The weights are float32 and every trial point is rounded to them, so a stored
step ``s`` is the step the weights really took. Memory: ``2 * history + 3`` float32 vectors the size of the trainable
weights, beside the step's own.

Stopping follows ``torch.optim.LBFGS``: the gradient's largest entry at most ``tolerance_grad``; the objective
changing by less than ``tolerance_change``, or the step's largest entry at most ``tolerance_change``; and
``max_evaluations`` over the whole run. The first trial step is ``learning_rate * min(1, 1 / |g|_1)`` on the first
iteration, where no curvature is known, and ``learning_rate`` after.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import keras
import tensorflow as tf

from accumrun.core.line_search import MOST_EVALUATIONS, Point, strong_wolfe

FLOAT32_EPSILON = 2.0**-23
"""The spacing of float32 numbers at 1: the objective, a float32 sum, resolves changes of this much of itself."""
CURVATURE_FLOOR = 1e-10
"""A pair whose ``y . s`` is at most this carries no usable curvature, and is not stored (as torch skips it)."""


class Evaluation(Protocol):
    """What the caller's evaluation reports of the current weights (the gradient is in the optimizer)."""

    @property
    def objective(self) -> float:
        """The full batch's mean loss, regularization included."""

    @property
    def finite(self) -> bool:
        """Whether the objective and the gradient were finite."""


E = TypeVar("E", bound=Evaluation)


@dataclass(frozen=True)
class Iteration(Generic[E]):
    """One L-BFGS iteration: the evaluation of the point it ended at, and why L-BFGS stops there, if it does."""

    evaluation: E
    evaluations: int
    """The objective evaluations this iteration made."""
    step_length: float
    """The accepted ``t`` along the search direction (0: no step was taken)."""
    gradient_norm: float
    """The Euclidean norm of the gradient at the point it ended at."""
    stopped: str | None = None


@dataclass(frozen=True)
class _Kept(Generic[E]):
    """What a trial point's evaluation keeps for the search: the caller's report and the gradient."""

    evaluation: E | None
    gradient: tf.Tensor | None
    """None for the starting point, which the search does not evaluate."""


class Lbfgs(keras.optimizers.Optimizer):
    """L-BFGS as a Keras optimizer whose ``apply`` keeps the gradient; :meth:`iterate` makes one iteration.

    ``learning_rate`` scales the first trial step (as ``torch.optim.LBFGS``'s ``lr``); it is not a step size.
    """

    def __init__(
        self,
        *,
        history: int = 10,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
        max_evaluations: int | None = None,
        learning_rate: float = 1.0,
        name: str = "lbfgs",
    ) -> None:
        super().__init__(learning_rate=learning_rate, name=name)
        self.history = history
        self.tolerance_grad = tolerance_grad
        self.tolerance_change = tolerance_change
        self.max_evaluations = max_evaluations

    def build(self, variables: list[Any]) -> None:
        """Create the state for ``variables``: the kept gradient, the curvature pairs, the current point's
        gradient and objective, and the counts."""
        if self.built:
            return
        super().build(variables)
        size = sum(math.prod(v.shape) for v in variables)
        self._kept = [self.add_variable_from_reference(v, "kept_gradient") for v in variables]
        self._s = [self.add_variable((size,), name=f"step_{i}") for i in range(self.history)]
        self._y = [self.add_variable((size,), name=f"gradient_change_{i}") for i in range(self.history)]
        self._gradient = self.add_variable((size,), name="gradient")
        self._objective = self.add_variable((), dtype="float64", name="objective")
        self._pairs = self.add_variable((), dtype="int64", name="pairs")
        self._evaluations = self.add_variable((), dtype="int64", name="evaluations")

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Keep ``gradient``; ``variable`` does not move."""
        self.assign(self._kept[self._get_variable_index(variable)], gradient)

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        """One evaluation's gradients: the backend sums them over the replicas and hands each to
        :meth:`update_step`. No clipping, decay or constraint applies, and ``iterations`` does not move: it counts
        accepted steps."""
        variables = self._trainable_variables if trainable_variables is None else list(trainable_variables)
        self._backend_update_step(list(grads), variables, self.learning_rate)

    @property
    def evaluations(self) -> int:
        """The objective evaluations made so far, over the whole run."""
        return int(self._evaluations.numpy())

    def iterate(self, evaluate: Callable[[], E]) -> Iteration[E]:
        """One iteration from the current weights; ``evaluate()`` evaluates the full batch at the weights as they
        are then (through the train step, so that this optimizer keeps the gradient).

        The first call of a run evaluates the starting point first. The weights end at the accepted point.
        """
        spent = 0
        if self.evaluations == 0:
            start = evaluate()
            spent = 1
            self._evaluations.assign_add(1)
            if not start.finite:
                reason = "L-BFGS stopped: the objective or its gradient is not finite at the starting weights"
                return Iteration(start, spent, 0.0, math.nan, reason)
            self._take(start.objective, _flat(self._kept))
            if self._largest(self._gradient) <= self.tolerance_grad:
                return Iteration(start, spent, 0.0, self._norm(self._gradient), self._gradient_stop())
        variables = self._trainable_variables
        x, g, f = _flat(variables), tf.identity(self._gradient.value), float(self._objective.numpy())
        direction = self._direction(g)
        slope = _dot(g, direction)
        if not slope < 0:
            # Curvature pairs bent by the gradient's rounding, near a minimum: nothing along here is lower.
            return self._no_step(evaluate, spent, "L-BFGS stopped: the search direction does not descend")
        first_step = float(keras.ops.convert_to_numpy(self.learning_rate))
        if int(self.iterations.numpy()) == 0:
            first_step *= min(1.0, 1.0 / float(tf.reduce_sum(tf.abs(g))))

        def phi(step: float) -> Point[_Kept[E]]:
            _assign_flat(variables, x + step * direction)
            evaluation = evaluate()
            gradient = _flat(self._kept)
            if not evaluation.finite:
                return Point(step, math.inf, math.nan, _Kept(evaluation, gradient))
            return Point(step, evaluation.objective, _dot(gradient, direction), _Kept(evaluation, gradient))

        budget = MOST_EVALUATIONS
        if self.max_evaluations is not None:
            budget = min(budget, max(1, self.max_evaluations - self.evaluations - spent))
        largest_direction = float(tf.reduce_max(tf.abs(direction)))
        tolerance = self.tolerance_change / largest_direction if largest_direction > 0 else 0.0
        here: Point[_Kept[E]] = Point(0.0, f, slope, _Kept(None, None))
        search = strong_wolfe(phi, here, first_step, budget=budget, tolerance=tolerance)
        spent += search.evaluations
        self._evaluations.assign_add(search.evaluations)
        accepted = search.point
        if accepted.kept.evaluation is None or accepted.kept.gradient is None:  # the start: no lower point
            _assign_flat(variables, x)
            return self._no_step(evaluate, spent, "L-BFGS stopped: the line search found no lower point")
        _assign_flat(variables, x + accepted.step * direction)
        s = _flat(variables) - x
        y = accepted.kept.gradient - g
        if _dot(y, s) > CURVATURE_FLOOR:
            slot = int(self._pairs.numpy()) % self.history
            self._s[slot].assign(s)
            self._y[slot].assign(y)
            self._pairs.assign_add(1)
        self._take(accepted.value, accepted.kept.gradient)
        self.iterations.assign_add(1)
        stopped = self._stop_reason(accepted.value, accepted.value - f, float(tf.reduce_max(tf.abs(s))))
        return Iteration(accepted.kept.evaluation, spent, accepted.step, self._norm(self._gradient), stopped)

    def _take(self, objective: float, gradient: tf.Tensor) -> None:
        """The current point's objective and gradient."""
        self._objective.assign(objective)
        self._gradient.assign(gradient)

    def _direction(self, gradient: tf.Tensor) -> tf.Tensor:
        """``-H g`` by the two-loop recursion over the stored pairs, oldest to newest (``-g`` before any)."""
        pairs = int(self._pairs.numpy())
        held = min(pairs, self.history)
        if not held:
            return -gradient
        order = [(pairs - held + i) % self.history for i in range(held)]
        s = [self._s[i].value for i in order]
        y = [self._y[i].value for i in order]
        rho = [1.0 / _dot(y_i, s_i) for s_i, y_i in zip(s, y, strict=True)]
        q = gradient
        alphas = []
        for s_i, y_i, rho_i in reversed(list(zip(s, y, rho, strict=True))):
            alpha = rho_i * _dot(s_i, q)
            alphas.append(alpha)
            q = q - alpha * y_i
        # The initial Hessian approximation gamma I, scaled by the newest pair (equation 7.20).
        r = q * (_dot(s[-1], y[-1]) / _dot(y[-1], y[-1]))
        for s_i, y_i, rho_i, alpha in zip(s, y, rho, reversed(alphas), strict=True):
            beta = rho_i * _dot(y_i, r)
            r = r + (alpha - beta) * s_i
        return -r

    def _no_step(self, evaluate: Callable[[], E], spent: int, reason: str) -> Iteration[E]:
        """No step taken: the current point evaluated once more, so that its row has its own metrics."""
        evaluation = evaluate()
        self._evaluations.assign_add(1)
        return Iteration(evaluation, spent + 1, 0.0, self._norm(self._gradient), reason)

    def _stop_reason(self, objective: float, change: float, largest_step: float) -> str | None:
        """Why L-BFGS stops at ``objective`` after a step that changed it by ``change``, if it does."""
        if self._largest(self._gradient) <= self.tolerance_grad:
            return self._gradient_stop()
        # A float32 objective rounds to the same value long before its minimum: a change below its resolution
        # says nothing, so the test counts only where tolerance_change is above that resolution.
        if abs(change) < self.tolerance_change and self.tolerance_change > abs(objective) * FLOAT32_EPSILON:
            return (
                f"L-BFGS converged: the objective changed by {abs(change):.3g}, less than tolerance_change "
                f"({self.tolerance_change:g})"
            )
        if largest_step <= self.tolerance_change:
            return (
                f"L-BFGS converged: the step's largest entry {largest_step:.3g} is at most tolerance_change "
                f"({self.tolerance_change:g})"
            )
        if self.max_evaluations is not None and self.evaluations >= self.max_evaluations:
            return f"L-BFGS stopped: max_evaluations ({self.max_evaluations}) reached"
        return None

    def _gradient_stop(self) -> str:
        return (
            f"L-BFGS converged: the gradient's largest entry {self._largest(self._gradient):.3g} is at most "
            f"tolerance_grad ({self.tolerance_grad:g})"
        )

    @staticmethod
    def _largest(vector: Any) -> float:
        return float(tf.reduce_max(tf.abs(vector)))

    @staticmethod
    def _norm(vector: Any) -> float:
        return float(tf.norm(tf.cast(vector, tf.float64)))


def _flat(variables: list[Any]) -> tf.Tensor:
    """The values of ``variables`` as one float32 vector."""
    return tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in variables], 0)


def _assign_flat(variables: list[Any], vector: tf.Tensor) -> None:
    """Set ``variables`` from one vector (as :func:`_flat` lays them out)."""
    sizes = [math.prod(v.shape) for v in variables]
    for variable, part in zip(variables, tf.split(vector, sizes), strict=True):
        variable.assign(tf.reshape(part, variable.shape))


def _dot(a: tf.Tensor, b: tf.Tensor) -> float:
    """``a . b``, summed in float64 (the directional derivatives near a minimum are small sums of large terms)."""
    return float(tf.reduce_sum(tf.cast(a, tf.float64) * tf.cast(b, tf.float64)))
