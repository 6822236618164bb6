"""The Trainer put together from a settled setup and its Run: the batches, the cadence, and the hooks, in order."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

from accumrun.core.batch_norm import PopulationStatistics
from accumrun.core.lbfgs import Lbfgs
from accumrun.core.observers import Observers
from accumrun.core.step import WholeBatchStep
from accumrun.core.sub_batches import replica_sub_batch_sizes
from accumrun.core.updates import UpdateLoop
from accumrun.kinds import BatchNormMode, Feed, OnNonFinite
from accumrun.objective import Scorer
from accumrun.rundir.metrics import EpochRow
from accumrun.training.autosub import Settled
from accumrun.training.batches import Batches, DeviceBatches, FedBatches
from accumrun.training.cadence import Cadence
from accumrun.training.checkpoint_hook import Checkpointing
from accumrun.training.console import ProgressBars
from accumrun.training.controls import Controlling, Controls
from accumrun.training.distribute import agreement
from accumrun.training.epoch_end import PreciseStatistics, Validation
from accumrun.training.hooks import Hook, Hooks
from accumrun.training.lbfgs import LbfgsBatches, LbfgsLog
from accumrun.training.log import EpochLog, RowSizes
from accumrun.training.loop import Trainer
from accumrun.training.measurement import Measuring
from accumrun.training.measurements import measured_periodically, measurement_hooks
from accumrun.training.nonfinite import NonFinitePolicy
from accumrun.training.run_folder import Run
from accumrun.training.setup import TrainingSetup
from accumrun.training.signals import Signals, resume_command
from accumrun.training.tensorboard import TensorBoardLog


def build_trainer(
    settled: Settled,
    run: Run,
    rows: list[EpochRow],
    controls: Controls,
    *,
    save_best: Callable[[], object],
    echo: Callable[[str], None],
    show_progress: bool,
) -> Trainer:
    """The Trainer of ``settled``, logging after ``rows``; ``save_best`` saves the model as the best so far."""
    setup, subdivisions = settled.setup, settled.subdivisions
    config, trained, fed, stepped = setup.config, setup.trained, setup.fed, setup.stepped
    plan = fed.chunk_sizes(subdivisions)
    # The largest sub-batch one device runs: the batch is dealt out to the replicas before it is cut.
    sub_batch_size = max(replica_sub_batch_sizes(fed.batch_size, stepped.replicas, subdivisions))
    recompute = _population_statistics(setup, sub_batch_size)
    training, output = config.training, config.output
    cadence = _cadence(setup, len(plan), every_epoch_end=controls.every_epoch or recompute is not None)
    batches = _batches(settled, plan)
    hooks: list[Hook] = [PreciseStatistics(recompute)] if recompute is not None else []
    if isinstance(batches, LbfgsBatches):
        # First: the row it fills and the stop it makes are what the later hooks log and act on.
        hooks.append(LbfgsLog(batches))
    if fed.dataset.val_size:
        # In batches no larger than a training sub-batch, so validation never needs more memory than training.
        scorer = Scorer(trained.model, trained.objective.objective, trained.val_metrics)
        val_feeder = fed.val_feeder(sub_batch_size)
        hooks.append(Validation(lambda: {f"val_{name}": value for name, value in scorer(val_feeder).items()}, cadence))
    hooks += measurement_hooks(training.measure, _measuring(settled, sub_batch_size, cadence, echo))
    metric_names = trained.objective.metric_names
    # Before the non-finite policy, which may stop the run: the good updates of its call are logged first.
    hooks.append(TensorBoardLog(run.folder, output.tensorboard, output.log_every_updates))
    hooks.append(NonFinitePolicy(training.on_nonfinite, loss_scaled=trained.loss_scaled, store=run.store, echo=echo))
    if show_progress:
        hooks.append(ProgressBars(len(plan), cadence.epochs))
    epoch_log = EpochLog(run.folder, epochs=cadence.epochs, metric_names=metric_names, echo=echo)
    controlling = Controlling(controls, trained.optimizer, save_best)
    hooks += [
        controlling,
        epoch_log,
        controlling.acting,
        Checkpointing(
            run.store,
            seconds=output.checkpoint_seconds,
            every_updates=output.checkpoint_every_updates,
            sync=epoch_log.sync,
        ),
        Signals(len(plan), resume_command(run.home)),
    ]
    return Trainer(
        batches=batches,
        sizes=RowSizes(fed.batch_size, subdivisions, stepped.replicas, sub_batch_size),
        optimizer=trained.optimizer,
        metric_names=metric_names,
        cadence=cadence,
        hooks=Hooks(hooks),
        agree=agreement(stepped.strategy),
        rows=rows,
    )


def _measuring(settled: Settled, sub_batch_size: int, cadence: Cadence, echo: Callable[[str], None]) -> Measuring:
    """What the hooks of ``training.measure`` are built from."""
    setup = settled.setup
    trained, fed = setup.trained, setup.fed
    objective = trained.objective.objective
    samples = setup.config.training.measure_samples
    return Measuring(
        training=setup.config.training,
        seed=fed.seed,
        batch_size=None if objective.token_level else fed.batch_size,
        optimizer=trained.optimizer,
        observers=Observers(setup.stepped.step_spec(settled.subdivisions).observers),
        cadence=cadence,
        echo=echo,
        model=trained.model,
        objective=objective,
        chunks=functools.partial(fed.inference_chunks, sub_batch_size, None if samples == "all" else samples),
    )


def _cadence(setup: TrainingSetup, batches_per_epoch: int, *, every_epoch_end: bool) -> Cadence:
    """Where the calls end for the host; ``every_epoch_end`` where the controls or the statistics need each epoch's
    end (so do checkpoints that are not taken by time)."""
    training, output = setup.config.training, setup.config.output
    return Cadence(
        epochs=training.epochs,
        batches_per_epoch=batches_per_epoch,
        validate_every=training.validate_every,
        validates=bool(setup.fed.dataset.val_size),
        every_epoch_end=every_epoch_end or output.checkpoint_seconds is None,
        checkpoint_seconds=output.checkpoint_seconds,
        checkpoint_every_updates=output.checkpoint_every_updates,
        updates_per_call=None if training.updates_per_call == "auto" else training.updates_per_call,
        measure_every=training.measure_every if measured_periodically(training.measure) else None,
    )


def _batches(settled: Settled, plan: list[list[int]]) -> Batches:
    """The batches through the step: several per call where batches come whole from arrays held on the device or
    read in one gather each (the disk cache), else one; with L-BFGS, each of those updates is one evaluation of its
    iterations."""
    batches = _fed_or_device_batches(settled, plan)
    setup = settled.setup
    if not setup.config.optimizer.kind.iterates:
        return batches
    # The kind that iterates builds the optimizer that drives the iterations.
    return LbfgsBatches(batches, cast(Lbfgs, setup.trained.optimizer))


def _fed_or_device_batches(settled: Settled, plan: list[list[int]]) -> Batches:
    """The batches through the step, one update each."""
    setup, step = settled.setup, settled.step
    fed, optimizer, metrics = setup.fed, setup.trained.optimizer, setup.stepped.train_metrics
    feeder = fed.train_feeder([size for sizes in plan for size in sizes])
    if fed.several_updates_per_call and isinstance(step, WholeBatchStep):
        held = feeder.resident
        loop = UpdateLoop(
            step,
            None if held is None else held.x,
            None if held is None else held.y,
            optimizer=optimizer,
            metrics=metrics,
            stop_on_nonfinite=setup.config.training.on_nonfinite is OnNonFinite.STOP,
        )
        return DeviceBatches(plan, feeder, loop)
    return FedBatches(plan, feeder, step, metrics=metrics, optimizer=optimizer)


def _population_statistics(setup: TrainingSetup, sub_batch_size: int) -> Callable[[], None] | None:
    """With ``batch_norm: precise``, what recomputes the moving statistics as population statistics; else None."""
    fed, stepped = setup.fed, setup.stepped
    batch_norm = stepped.batch_norm
    if batch_norm.mode is not BatchNormMode.PRECISE or not batch_norm.records:
        return None
    statistics = PopulationStatistics(setup.trained.model, batch_norm, sub_batch_size, stepped.strategy)
    # Whole batches, cut on the device, when they fit; else the sub-batches one at a time; over the training
    # samples (or precise_bn_samples of them, seeded), augmentation in inference mode.
    chunk = fed.batch_size if fed.feed is Feed.BATCH else sub_batch_size
    return lambda: statistics(x for x, _ in fed.inference_chunks(chunk, stepped.precise_bn_samples))
