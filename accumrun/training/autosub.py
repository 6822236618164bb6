"""``training.subdivisions: auto``: the fewest subdivisions whose sub-batch fits in memory, found by trying the
first batch with 1, 2, 4, ... through the real step (the batch, so the math, stays fixed). The state is put back
after each try, so training starts as a run with the chosen value fixed would. TensorFlow does not always recover
cleanly from an out-of-memory error; when a retry fails otherwise, the sizes are probed in fresh processes.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import tensorflow as tf

from accumrun.config.remat import settle_remat
from accumrun.core.step import TrainStep
from accumrun.errors import ConfigError
from accumrun.kinds import Remat
from accumrun.rundir.status import AutoNote
from accumrun.training.budget import check_budget, choose_under_budget
from accumrun.training.probe import fits_in_fresh_process, measure_in_fresh_process
from accumrun.training.setup import TrainingSetup, build_training


@dataclass
class AutoChoice:
    """The chosen subdivisions, the step compiled for it, and every count tried, in order."""

    subdivisions: int
    step: TrainStep = field(init=False)  # set by choose_subdivisions before it returns the choice
    tried: list[int] = field(default_factory=list)


def choose_subdivisions(
    make_step: Callable[[int], TrainStep],
    state: list[tf.Variable],
    x: tf.Tensor,
    y: tf.Tensor,
    max_sub_batch: int | None,
    fits_in_fresh_process: Callable[[int], bool],
    echo: Callable[[str], None],
) -> AutoChoice:
    """Find the fewest subdivisions of the batch ``(x, y)`` that train without running out of memory.

    ``make_step(s)`` compiles the step for ``s`` subdivisions; ``state`` (every variable) is restored after every
    try; ``fits_in_fresh_process(s)`` runs one batch in a new process. ConfigError: even sub-batches of one sample
    do not fit, or a size that fits in a fresh process still fails in this one.
    """
    batch_size = int(x.shape[0])
    snapshot = [v.numpy() for v in state]
    # One sub-batch, or as few as keep sub-batches within max_sub_batch.
    choice = AutoChoice(min(batch_size, math.ceil(batch_size / max_sub_batch)) if max_sub_batch else 1)
    try:
        while True:
            choice.tried.append(choice.subdivisions)
            try:
                choice.step = make_step(choice.subdivisions)
                choice.step.train_batch([(x, y)], batch_size)
                return choice
            except tf.errors.ResourceExhaustedError:
                _next_or_give_up(choice, batch_size, echo)
            except tf.errors.OpError as error:
                if len(choice.tried) == 1:
                    raise
                # The runtime may be left unusable by the earlier out-of-memory error; ask a clean process.
                echo(f"subdivisions {choice.subdivisions}: {type(error).__name__} after out of memory")
                while True:
                    echo(f"probing subdivisions {choice.subdivisions} in a fresh process")
                    if fits_in_fresh_process(choice.subdivisions):
                        break
                    _next_or_give_up(choice, batch_size, echo)
                    choice.tried.append(choice.subdivisions)
                choice.step = make_step(choice.subdivisions)
                try:
                    choice.step.train_batch([(x, y)], batch_size)
                except tf.errors.OpError:
                    raise ConfigError(
                        "training.subdivisions",
                        f"auto: {choice.subdivisions} fit in a fresh process but fail in this one after an "
                        f"out-of-memory error; set training.subdivisions: {choice.subdivisions} and run again",
                    ) from None
                return choice
            finally:
                for variable, value in zip(state, snapshot, strict=True):
                    variable.assign(value)
    finally:
        gc.collect()


def _next_or_give_up(choice: AutoChoice, batch_size: int, echo: Callable[[str], None]) -> None:
    if choice.subdivisions >= batch_size:
        raise ConfigError(
            "training.subdivisions", "auto: out of memory even with sub-batches of one sample; shrink the model"
        )
    larger = min(2 * choice.subdivisions, batch_size)
    echo(
        f"subdivisions {choice.subdivisions} (sub-batches of {math.ceil(batch_size / choice.subdivisions)}): "
        f"out of memory; retrying the first batch with {larger}"
    )
    choice.subdivisions = larger
    gc.collect()


@dataclass(frozen=True)
class Settled:
    """A setup with ``subdivisions`` settled, the step compiled for it, and what ``auto`` chose (None: a number)."""

    setup: TrainingSetup
    subdivisions: int
    step: TrainStep
    auto: AutoNote | None


def settle_subdivisions(setup: TrainingSetup, echo: Callable[[str], None]) -> Settled:
    """Compile the train step; for ``subdivisions: auto``, choose the subdivisions first, into a new setup (under a
    ``memory_budget``, by measuring each candidate in a fresh process: :mod:`accumrun.training.budget`)."""
    stepped, config = setup.stepped, setup.config
    budget = config.training.budget_bytes
    if budget is not None:
        check_budget(setup)
    if budget is not None and (stepped.subdivisions is None or config.training.remat == "auto"):
        return _settled_under_budget(setup, budget, echo)
    if stepped.subdivisions is not None:
        return Settled(setup, stepped.subdivisions, setup.make_step(stepped.subdivisions), None)
    x, y = setup.fed.first_batch()
    choice = choose_subdivisions(
        setup.make_step,
        [*setup.trained.model.variables, *setup.trained.optimizer.variables, *stepped.train_metrics.variables],
        x,
        y,
        config.training.max_sub_batch,
        lambda subdivisions: fits_in_fresh_process(config, subdivisions),
        echo,
    )
    echo(f"subdivisions: auto chose {choice.subdivisions} (tried {', '.join(map(str, choice.tried))})")
    return _settled(setup, AutoNote(choice.subdivisions, tuple(choice.tried)), choice.step)


def _settled_under_budget(setup: TrainingSetup, budget: int, echo: Callable[[str], None]) -> Settled:
    """Choose the subdivisions, and the remat where it is ``auto``, by measuring candidates in fresh processes; a
    remat mode other than the one the setup was built with (``auto`` builds as ``none``) builds it again."""
    config = setup.config
    note = choose_under_budget(config, budget, setup.fed.batch_size, measure_in_fresh_process, echo)
    echo(
        f"subdivisions: auto chose {note.chosen}, remat {note.remat}, under memory_budget "
        f"{config.training.memory_budget} (tried {', '.join(map(str, note.tried))})"
    )
    training = config.training.model_copy(update={"remat": Remat(note.remat)})
    if training.remat is not settle_remat(config.training.remat):
        setup = build_training(config.model_copy(update={"training": training}), setup.stepped.strategy)
    else:
        setup = replace(setup, config=config.model_copy(update={"training": training}))
    return _settled(setup, note, setup.make_step(note.chosen))


def _settled(setup: TrainingSetup, note: AutoNote, step: TrainStep) -> Settled:
    """``setup`` with the subdivisions ``auto`` chose: the settled count is what config.yaml records and what a
    resumed run keeps."""
    settled = replace(
        setup,
        config=setup.config.with_subdivisions(note.chosen),
        stepped=replace(setup.stepped, subdivisions=note.chosen),
    )
    return Settled(settled, note.chosen, step, note)
