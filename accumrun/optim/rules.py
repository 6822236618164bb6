"""The rules that an optimizer's kind makes for the rest of a run, read from what it declares
(:class:`~accumrun.optim.kind.OptimizerKind`), written once for every kind: the config's cross-field check asks
:func:`optimizer_problems`, and setup asks :func:`model_problem` once the model is built.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from accumrun.kinds import BatchNormMode, Measure, Precision
from accumrun.optim.kind import OptimizerKind
from accumrun.optim.section import OptimizerSection

Problem = tuple[str, str, Any]
"""A broken rule: the key to blame, what is wrong, and the value given."""

_SAME_OBJECTIVE = "the same objective at the same weights"


def optimizer_problems(
    optimizer: OptimizerSection,
    *,
    augment: list[str],
    batch_size: int | str,
    precision: Precision,
    measure: Sequence[Measure],
) -> Iterator[Problem]:
    """What the optimizer's kind refuses of the rest of the config (``augment``: the augmentations' names), and the
    plateau's rule: it cannot change a schedule."""
    kind = optimizer.kind
    if kind.same_objective and augment:
        yield "data.augment", f"{kind.name} needs {_SAME_OBJECTIVE}; augmentation draws anew every epoch", augment
    if kind.full_batch and batch_size != "full":
        message = f"{kind.name} needs the exact full-batch gradient; set training.batch_size: full"
        yield "training.batch_size", message, batch_size
    if precision not in kind.precisions:
        needed = " or ".join(str(taken) for taken in kind.precisions)
        yield "training.precision", f"{kind.name} needs {needed}; {kind.precision_reason}", str(precision)
    if kind.full_batch and Measure.NOISE_SCALE in measure:
        message = f"the noise scale measures minibatch steps; {kind.name} takes full-batch ones"
        yield "training.measure", message, str(Measure.NOISE_SCALE)
    plateau, schedule = optimizer.reduce_on_plateau, optimizer.schedule
    if plateau is not None and schedule is not None:
        message = f"cannot change a learning-rate schedule ({schedule.name}); use a number"
        yield "optimizer.reduce_on_plateau", message, plateau.monitor


def model_problem(kind: OptimizerKind[Any], batch_norm: BatchNormMode, *, has_batch_norm: bool) -> Problem | None:
    """Refuse BatchNorm that moves its statistics (every mode but ``frozen``) where the kind needs the same objective
    at the same weights: they would change it between evaluations. (The step's inference mode turns dropout and noise
    off.)"""
    if kind.same_objective and has_batch_norm and batch_norm is not BatchNormMode.FROZEN:
        message = f"{kind.name} needs {_SAME_OBJECTIVE}; a model with BatchNorm takes frozen only"
        return "training.batch_norm", message, str(batch_norm)
    return None
