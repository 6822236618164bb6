"""A training run from start to end: build the setup, settle ``subdivisions: auto``, open the Run, assemble the
Trainer, fit, and save the model."""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from accumrun._version import __version__
from accumrun.config.schema import Config
from accumrun.core.sub_batches import epoch_batches
from accumrun.errors import WorkerLost
from accumrun.models.floats import floats
from accumrun.models.lora import checkpointed_variables
from accumrun.models.saving import CompileSpec, save_trained_model
from accumrun.rundir.status import BatchNormNote
from accumrun.training.autosub import Settled, settle_subdivisions
from accumrun.training.checkpoints import Position
from accumrun.training.console import describe_setup, device_name, run_summary
from accumrun.training.controls import Controls
from accumrun.training.distribute import PEER_ERRORS, describe_strategy, is_chief, lost_worker
from accumrun.training.graph_release import releasing_traced_graphs
from accumrun.training.run_folder import Run
from accumrun.training.setup import TrainingSetup, build_training
from accumrun.training.trainer_assembly import build_trainer


@dataclass
class RunResult:
    """What a finished run leaves: its directory, its rows (as ``metrics.jsonl`` holds them) and the model."""

    run_dir: Path
    metrics: list[dict[str, Any]]
    model: keras.Model


def train_run(
    config: Config,
    run_dir: Path,
    *,
    strategy: tf.distribute.Strategy | None = None,
    quiet: bool = False,
    resume: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """Train as configured into ``run_dir``; with ``resume``, continue the run there (the caller has checked that
    ``config`` is compatible). Everything that can be refused is checked before anything is written. On a
    multi-worker run only the chief writes ``run_dir``, on a filesystem every worker sees (a resumed worker
    restores the chief's latest checkpoint); the others train alike in a scratch folder, removed when they end.

    Raises:
        ConfigError, DataError: the config or the data is refused; nothing was written.
        Interrupted: SIGINT or SIGTERM stopped the run after a checkpoint.
        TrainingDiverged: the loss or a gradient became NaN or Inf.
        WorkerLost: a worker of a multi-worker run stopped answering; the last checkpoint is intact.
    """
    echo: Callable[[str], None] = (lambda line: None) if quiet else functools.partial(print, flush=True)
    # float64 for the whole run: Keras turns a Python number into a tensor of its floatx as it traces (an L2
    # regularizer's factor would be rounded to float32).
    with floats(config.training.precision), releasing_traced_graphs():
        settled = settle_subdivisions(build_training(config, strategy, resumed=run_dir if resume else None), echo)
        if is_chief(strategy):
            return _train(
                settled,
                run_dir,
                echo=echo,
                show_progress=not quiet,
                run_home=run_dir,
                resume=resume,
                overwrite=overwrite,
            )
        scratch = Path(tempfile.mkdtemp(prefix="accumrun-worker-"))
        try:
            return _train(settled, scratch / "run", echo=echo, show_progress=not quiet, run_home=run_dir, resume=resume)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _train(
    settled: Settled,
    run_dir: Path,
    *,
    echo: Callable[[str], None],
    show_progress: bool,
    run_home: Path,
    resume: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """Train ``settled`` into ``run_dir`` (``run_home``, or a scratch folder), resuming from ``run_home`` if asked."""
    setup = settled.setup
    config, trained, fed = setup.config, setup.trained, setup.fed
    batches_per_epoch, _ = epoch_batches(fed.dataset.train_size, fed.batch_size, fed.drop_remainder)
    run = Run.open(
        run_dir,
        home=run_home,
        keep=config.output.keep_checkpoints,
        batches_per_epoch=batches_per_epoch,
        # What a checkpoint holds.
        state={
            "model": checkpointed_variables(trained.model, adapted=config.model.lora is not None),
            "optimizer": trained.optimizer.variables,
            "metrics": setup.stepped.train_metrics.variables,
        },
    )
    logged = ["loss", *trained.objective.metric_names]
    controls = Controls(config, logged + [f"val_{name}" for name in logged] if fed.dataset.val_size else logged)
    position, rows = run.resume(config.training.epochs) if resume else run.start(overwrite=overwrite)
    # The controls' state is a function of the rows: replayed, it is what the interrupted run had.
    controls.replay(rows)
    run.write_files(config, fed.dataset)
    batch_norm = setup.stepped.batch_norm
    layers = len(batch_norm.layers)
    status = run.status(
        resumed=resume,
        batch_norm=BatchNormNote(layers, batch_norm.mode) if layers else None,
        subdivisions_auto=settled.auto,
    )
    with status, _worker_losses(setup, run):
        # Inside the status: a failure while building the Trainer (TensorBoard, feeders) is recorded too.
        trainer = build_trainer(
            settled,
            run,
            rows,
            controls,
            save_best=functools.partial(_save_model, setup, run.folder / "model.best.keras"),
            echo=echo,
            show_progress=show_progress,
        )
        _announce(setup, run.folder, position, echo)
        started = time.monotonic()
        rows = trainer.fit(position)
        status.reason = rows[-1].stopped
        note = _save_model(setup, run.folder / "model.keras").describe()
        if note is not None:
            echo(note)
        headline = controls.headline(validated=fed.dataset.val_size > 0)
        seconds = time.monotonic() - started
        echo(run_summary(rows, position.epoch + 1, seconds, headline, run.folder / "model.keras", resumed=resume))
    return RunResult(run.folder, [row.to_json() for row in rows], trained.model)


def _save_model(setup: TrainingSetup, path: Path) -> CompileSpec:
    """Save the trained model to ``path`` as ``model.keras`` holds it (see :mod:`accumrun.models.saving`)."""
    return save_trained_model(
        setup.model_to_save(),
        path,
        objective=setup.trained.objective.objective,
        optimizer=setup.trained.optimizer,
        strategy=setup.stepped.strategy,
    )


@contextlib.contextmanager
def _worker_losses(setup: TrainingSetup, run: Run) -> Iterator[None]:
    """Turn a lost peer of a multi-worker run into :class:`WorkerLost`, saying how to go on."""
    try:
        yield
    except PEER_ERRORS as error:
        lost = lost_worker(error, setup.stepped.strategy)
        if lost is None:
            raise
        after = (
            f"the last checkpoint is intact: restart every worker with --resume {run.home}"
            if run.home_store.latest() is not None
            else "there is no checkpoint yet: start the run again"
        )
        timeout = setup.config.distribute.timeout_seconds
        raise WorkerLost(f"{lost} stopped answering (distribute.timeout_seconds: {timeout}); {after}") from None


def _announce(setup: TrainingSetup, run_dir: Path, position: Position, echo: Callable[[str], None]) -> None:
    """The startup summary: versions and device, the strategy, the derived sizes, where a resumed run picks up."""
    echo(f"accumrun {__version__} | TensorFlow {tf.__version__} on {device_name()} | run dir {run_dir}")
    strategy = setup.stepped.strategy
    if strategy is not None:
        echo(f"distribute {describe_strategy(strategy)}")
    echo("\n".join(describe_setup(setup)))
    if position.epoch or position.batch:
        echo(f"resuming at epoch {position.epoch + 1}, batch {position.batch + 1}")
