"""Full-batch L-BFGS (Nocedal and Wright, algorithm 7.5, with the two-loop recursion of algorithm 7.4) on the exact
gradient that the train step accumulates over sub-batches.

How it meets the train step. :class:`Lbfgs` is a Keras optimizer whose "update" keeps the batch's gradient (summed
over the replicas, as Keras sums it for any optimizer) and moves no weight. So one call of the ordinary step, on
the full batch, is one evaluation of the objective and its gradient at the current weights, through the same
sub-batch accumulation, feeds, replicas and weights as any training. :meth:`Lbfgs.iterate` drives the evaluations:
it sets the weights to each trial point of the line search (:mod:`accumrun.core.line_search`) and calls back.
Under ``training.precision: float64`` its vectors, like the weights and the sums, are float64 (Keras' floatx).

Its state is the optimizer's variables, checkpointed like Adam's slots: the curvature pairs (the newest ``history``
of them, oldest first), the gradient and objective at the current weights, and the counts. ``iterations`` counts
accepted steps, so a resumed run continues exactly. The weights are float32 and every trial point is rounded to
them, so a stored step ``s`` is the step the weights really took. Memory: the state is ``2 * history + 2`` vectors
the size of the trainable weights (the kept gradient, the pairs, the current gradient); an iteration holds about six
more while it runs (the weights it started from, the direction, the two-loop's running vector, the gradients of the
line search's points).

Stopping follows ``torch.optim.LBFGS``: the gradient's largest entry at most ``tolerance_grad``; the objective
changing by less than ``tolerance_change`` (counted only where that is above the objective's resolution,
``|f| * 1.2e-7`` in float32, :mod:`accumrun.core.resolution`: below it a change of 0 says only that float32 could not
see one), or the step's largest entry at
most ``tolerance_change``; and ``max_evaluations`` over the whole run. The first trial step is
``learning_rate * min(1, 1 / |g|_1)`` on the first iteration, where no curvature is known, and ``learning_rate``
after.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import keras
import tensorflow as tf

from accumrun.core.line_search import MOST_EVALUATIONS, Point, strong_wolfe
from accumrun.core.resolution import curvature_floor, epsilon


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


class _Counted(Generic[E]):
    """``evaluate``, each call counted into the run's ``evaluations`` and into :attr:`calls` (this iteration's)."""

    def __init__(self, evaluate: Callable[[], E], evaluations: Any) -> None:
        self._evaluate = evaluate
        self._evaluations = evaluations
        self.calls = 0

    def __call__(self) -> E:
        self.calls += 1
        self._evaluations.assign_add(1)
        return self._evaluate()


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
        # NaN until the run's first point is evaluated.
        self._objective = self.add_variable(
            (), initializer=keras.initializers.Constant(math.nan), dtype="float64", name="objective"
        )
        self._pairs = self.add_variable((), dtype="int64", name="pairs")
        self._evaluations = self.add_variable((), dtype="int64", name="evaluations")
        self._vectors = _Vectors(self._trainable_variables, self._kept, self)
        self._here: Any = None
        """The evaluation of the current weights, once this process has made one."""

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

        The first call of a run evaluates the starting point first. The weights end at the accepted point; where
        no step is taken they stay, and the iteration reports their last evaluation.
        """
        counted = _Counted(evaluate, self._evaluations)
        if math.isnan(float(self._objective.numpy())):  # no point yet: the run's first iteration
            start = counted()
            if not start.finite:
                reason = "L-BFGS stopped: the objective or its gradient is not finite at the starting weights"
                return Iteration(start, counted.calls, 0.0, math.nan, reason)
            self._here = start
            largest, norm = (float(v) for v in self._vectors.take_start(tf.constant(start.objective, tf.float64)))
            if largest <= self.tolerance_grad:
                return Iteration(start, counted.calls, 0.0, norm, self._gradient_stop(largest))
        remaining = self._remaining()
        if remaining == 0:
            return self._no_step(counted, self._budget_spent())
        vectors = self._vectors
        begun = vectors.begin()
        x, direction = begun.x, begun.direction
        slope, f = float(begun.slope), float(begun.objective)
        if not slope < 0:
            # Curvature pairs bent by the gradient's rounding, near a minimum: nothing along here is lower.
            return self._no_step(counted, "L-BFGS stopped: the search direction does not descend")
        first_step = float(begun.learning_rate)
        if int(begun.iterations) == 0:
            first_step *= min(1.0, 1.0 / float(begun.gradient_l1))

        def phi(step: float) -> Point[_Kept[E]]:
            vectors.move(x, direction, tf.constant(step, tf.float64))
            evaluation = counted()
            gradient, slope = vectors.kept_slope(direction)
            if not evaluation.finite:
                return Point(step, math.inf, math.nan, _Kept(evaluation, gradient))
            return Point(step, evaluation.objective, float(slope), _Kept(evaluation, gradient))

        budget = MOST_EVALUATIONS if remaining is None else min(MOST_EVALUATIONS, remaining)
        # The bracket is too short once its steps differ by less than tolerance_change in every weight.
        tolerance = self.tolerance_change / float(begun.largest_direction)
        here: Point[_Kept[E]] = Point(0.0, f, slope, _Kept(None, None))
        search = strong_wolfe(phi, here, first_step, budget=budget, tolerance=tolerance)
        accepted = search.point
        if accepted.kept.evaluation is None:  # the start: no lower point
            vectors.move(x, direction, tf.constant(0.0, tf.float64))
            if self._remaining() == 0:
                return self._no_step(counted, self._budget_spent())
            return self._no_step(counted, "L-BFGS stopped: the line search found no lower point")
        self._here = accepted.kept.evaluation
        largest, norm, largest_step = (
            float(v)
            for v in vectors.accept(
                x,
                direction,
                tf.constant(accepted.step, tf.float64),
                accepted.kept.gradient,
                tf.constant(accepted.value, tf.float64),
            )
        )
        stopped = self._stop_reason(largest, accepted.value, accepted.value - f, largest_step)
        return Iteration(accepted.kept.evaluation, counted.calls, accepted.step, norm, stopped)

    def _remaining(self) -> int | None:
        """The evaluations ``max_evaluations`` still allows (None: no limit)."""
        return None if self.max_evaluations is None else max(0, self.max_evaluations - self.evaluations)

    def _budget_spent(self) -> str:
        return f"L-BFGS stopped: max_evaluations ({self.max_evaluations}) reached"

    def _no_step(self, counted: _Counted[E], reason: str) -> Iteration[E]:
        """No step taken: the weights' own evaluation reported (made once more only if this process has none, as
        after a resume)."""
        if self._here is None:
            self._here = counted()
        _, norm = _Vectors.gradient_norms(self._gradient.value)
        return Iteration(self._here, counted.calls, 0.0, float(norm), reason)

    def _stop_reason(self, largest: float, objective: float, change: float, largest_step: float) -> str | None:
        """Why L-BFGS stops at ``objective``, whose gradient's largest entry is ``largest``, after a step (whose
        largest entry is ``largest_step``) that changed it by ``change``, if it does."""
        if largest <= self.tolerance_grad:
            return self._gradient_stop(largest)
        # A float32 objective rounds to the same value long before its minimum: a change below its resolution
        # says nothing, so the test counts only where tolerance_change is above that resolution.
        if abs(change) < self.tolerance_change and self.tolerance_change > abs(objective) * epsilon(
            self._gradient.dtype
        ):
            return (
                f"L-BFGS converged: the objective changed by {abs(change):.3g}, less than tolerance_change "
                f"({self.tolerance_change:g})"
            )
        if largest_step <= self.tolerance_change:
            return (
                f"L-BFGS converged: the step's largest entry {largest_step:.3g} is at most tolerance_change "
                f"({self.tolerance_change:g})"
            )
        if self._remaining() == 0:
            return self._budget_spent()
        return None

    def _gradient_stop(self, largest: float) -> str:
        return (
            f"L-BFGS converged: the gradient's largest entry {largest:.3g} is at most tolerance_grad "
            f"({self.tolerance_grad:g})"
        )


class _Begun(NamedTuple):
    """What an iteration starts from: the weights as one vector, the search direction, the slope along it,
    ``max |d|``, ``|g|_1``, the state's objective and accepted steps, and the learning rate."""

    x: tf.Tensor
    direction: tf.Tensor
    slope: tf.Tensor
    largest_direction: tf.Tensor
    gradient_l1: tf.Tensor
    objective: tf.Tensor
    iterations: tf.Tensor
    learning_rate: tf.Tensor


class _Vectors:
    """An iteration's work on the state and on vectors the size of the weights, each piece one compiled call, so
    that the host handles only numbers: the start (:meth:`begin`: the two-loop direction), a trial point
    (:meth:`move`, then :meth:`kept_slope`), the accepted point (:meth:`accept`: a curvature pair) and the run's
    first point (:meth:`take_start`)."""

    def __init__(self, variables: list[Any], kept: list[Any], lbfgs: Lbfgs) -> None:
        self._variables, self._kept, self._lbfgs = variables, kept, lbfgs
        self.begin = tf.function(self._begin, autograph=False)
        self.move = tf.function(self._move, autograph=False)
        self.kept_slope = tf.function(self._kept_slope, autograph=False)
        self.accept = tf.function(self._accept, autograph=False)
        self.take_start = tf.function(self._take_start, autograph=False)

    def _begin(self) -> _Begun:
        lbfgs = self._lbfgs
        gradient = lbfgs._gradient.value
        direction = self._direction(gradient)
        return _Begun(
            _flat(self._variables),
            direction,
            _dot(gradient, direction),
            tf.reduce_max(tf.abs(direction)),
            tf.reduce_sum(tf.abs(tf.cast(gradient, tf.float64))),
            tf.identity(lbfgs._objective.value),
            tf.identity(lbfgs.iterations.value),
            tf.cast(lbfgs.learning_rate, tf.float64),
        )

    def _direction(self, gradient: tf.Tensor) -> tf.Tensor:
        """``d = -H g`` by the two-loop recursion (algorithm 7.4) over the ``history`` slots, oldest to newest. A
        slot not filled yet is zeros and weighs nothing, so before any pair ``d`` is ``-g``; the loops are unrolled
        over every slot."""
        lbfgs = self._lbfgs
        s = [v.value for v in lbfgs._s]
        y = [v.value for v in lbfgs._y]
        slots = range(lbfgs.history)
        rho = [_safe_divide(tf.constant(1.0, tf.float64), _dot(y[i], s[i])) for i in slots]
        q = gradient
        alphas: dict[int, tf.Tensor] = {}
        for i in reversed(slots):
            alphas[i] = rho[i] * _dot(s[i], q)
            q = q - tf.cast(alphas[i], q.dtype) * y[i]
        # The initial Hessian approximation gamma I, scaled by the newest pair (equation 7.20); 1 before any.
        gamma = _safe_divide(_dot(s[-1], y[-1]), _dot(y[-1], y[-1]), otherwise=1.0)
        r = q * tf.cast(gamma, q.dtype)
        for i in slots:
            beta = rho[i] * _dot(y[i], r)
            r = r + tf.cast(alphas[i] - beta, r.dtype) * s[i]
        return -r

    def _move(self, x: tf.Tensor, direction: tf.Tensor, step: tf.Tensor) -> None:
        """Set the weights to ``x + step * direction`` (rounded to their dtype, so a step is the one they take)."""
        vector = x + tf.cast(step, x.dtype) * direction
        sizes = [math.prod(v.shape) for v in self._variables]
        for variable, part in zip(self._variables, tf.split(vector, sizes), strict=True):
            variable.assign(tf.reshape(part, variable.shape))

    def _kept_slope(self, direction: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The kept gradient, and its slope along ``direction``."""
        gradient = _flat(self._kept)
        return gradient, _dot(gradient, direction)

    def _accept(
        self, x: tf.Tensor, direction: tf.Tensor, step: tf.Tensor, gradient: tf.Tensor, objective: tf.Tensor
    ) -> tuple[tf.Tensor, ...]:
        """Take the point ``step`` along ``direction`` from ``x``, where the objective and gradient are these: store
        its curvature pair (where ``y . s`` carries curvature) and count the step. Returns the new gradient's
        largest entry and norm, and the step's largest entry."""
        lbfgs = self._lbfgs
        self._move(x, direction, step)
        s = _flat(self._variables) - x
        y = gradient - lbfgs._gradient.value

        def store() -> tf.Tensor:
            # The slots hold the pairs oldest to newest: each moves one down (the oldest drops out), the new one
            # goes last. Copies of the history, but one order for the two-loop recursion to read.
            for older, newer in itertools.pairwise([*lbfgs._s, s]):
                older.assign(newer)
            for older, newer in itertools.pairwise([*lbfgs._y, y]):
                older.assign(newer)
            lbfgs._pairs.assign_add(1)
            return tf.constant(True)

        tf.cond(_dot(y, s) > curvature_floor(y, s), store, lambda: tf.constant(False))
        lbfgs._gradient.assign(gradient)
        lbfgs._objective.assign(objective)
        lbfgs.iterations.assign_add(1)
        return (*self.gradient_norms(gradient), tf.reduce_max(tf.abs(s)))

    def _take_start(self, objective: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The run's first point, just evaluated: keep its objective and gradient."""
        gradient = _flat(self._kept)
        self._lbfgs._gradient.assign(gradient)
        self._lbfgs._objective.assign(objective)
        return self.gradient_norms(gradient)

    @staticmethod
    def gradient_norms(gradient: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """A gradient's largest entry and Euclidean norm."""
        as_float64 = tf.cast(gradient, tf.float64)
        return tf.reduce_max(tf.abs(as_float64)), tf.norm(as_float64)


def _flat(variables: list[Any]) -> tf.Tensor:
    """The values of ``variables`` as one vector, in their dtype."""
    return tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in variables], 0)


def _safe_divide(a: tf.Tensor, b: tf.Tensor, otherwise: float = 0.0) -> tf.Tensor:
    """``a / b``, or ``otherwise`` where ``b`` is 0 (an empty slot)."""
    return tf.where(b > 0, a / tf.where(b > 0, b, 1.0), tf.constant(otherwise, tf.float64))


def _dot(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``a . b``, summed in float64 (the directional derivatives near a minimum are small sums of large terms)."""
    return tf.reduce_sum(tf.cast(a, tf.float64) * tf.cast(b, tf.float64))
