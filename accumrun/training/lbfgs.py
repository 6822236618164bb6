"""Full-batch L-BFGS in the Trainer: one iteration per call and per epoch (:class:`LbfgsBatches`), and its columns
and stop (:class:`LbfgsLog`).

Each evaluation is one ordinary update of the full batch through the train step, whose optimizer,
:class:`~accumrun.core.lbfgs.Lbfgs`, keeps the gradient instead of moving the weights; so evaluations see the feed,
the sub-batches, the replicas and the weights as training does. An epoch's row is the accepted point's, never a
trial point's: its loss and metrics come from that point's evaluation. Validation, checkpoints and controls run
between iterations (at the ends of calls), never inside a line search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accumrun.core.lbfgs import Iteration, Lbfgs
from accumrun.core.updates import Updates
from accumrun.training.batches import Batches
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import EpochEnd, Hook


@dataclass(frozen=True)
class _Evaluation:
    """One full-batch evaluation, as the step's update reported it."""

    updates: Updates

    @property
    def objective(self) -> float:
        return float(self.updates.loss_sums[0]) / float(self.updates.units[0])

    @property
    def finite(self) -> bool:
        return bool(self.updates.applied[0])


class LbfgsBatches(Batches):
    """The full batch of ``evaluations`` (whose step's optimizer is ``optimizer``), one L-BFGS iteration per call."""

    def __init__(self, evaluations: Batches, optimizer: Lbfgs) -> None:
        super().__init__(evaluations.plan)
        if len(self.plan) != 1:
            raise ValueError("L-BFGS takes the full batch: one batch per epoch")
        self._evaluations = evaluations
        self._optimizer = optimizer
        self.last: Iteration[_Evaluation] | None = None
        """The iteration the last call made."""

    def most_per_call(self, batch: int) -> int:
        return 1

    def run(self, epoch: int, batch: int, count: int) -> Updates:
        if (batch, count) != (0, 1):
            raise ValueError("L-BFGS runs one iteration (one epoch) per call")
        # Every evaluation in the first epoch's order: the objective is the same sum at the same weights whichever
        # iteration asks (the data's order only changes how float32 rounds it).
        iteration = self._optimizer.iterate(lambda: _Evaluation(self._evaluations.run(0, 0, 1)))
        self.last = iteration
        accepted = iteration.evaluation.updates
        return accepted._replace(
            optimizer_steps=np.array([int(self._optimizer.iterations.numpy())], np.int64),
            measures=np.zeros([1, 0], np.float64),
        )

    @property
    def traces(self) -> int:
        return self._evaluations.traces


class LbfgsLog(Hook):
    """Adds each iteration's evaluations, step length and gradient norm to its row, and ends the run where L-BFGS
    stops (converged, or out of evaluations), with the reason in the row."""

    def __init__(self, batches: LbfgsBatches) -> None:
        self._batches = batches

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        iteration = self._batches.last
        if iteration is None:
            return {}
        return {
            "evaluations": float(iteration.evaluations),
            "step_length": iteration.step_length,
            "gradient_norm": iteration.gradient_norm,
        }

    def on_epoch_end(self, end: EpochEnd) -> None:
        iteration = self._batches.last
        if iteration is not None and iteration.stopped is not None and end.row.stopped is None:
            end.stop(iteration.stopped)
