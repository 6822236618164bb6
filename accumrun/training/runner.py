"""A training run from start to end: build, settle ``subdivisions: auto``, claim or resume the run folder,
loop over the epochs, save the model, and record in ``run.json`` how it ended."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import keras
import tensorflow as tf

from accumrun._version import __version__
from accumrun.config.schema import Config
from accumrun.core.split import epoch_batches
from accumrun.core.step import TrainStep
from accumrun.errors import ConfigError, Interrupted, WorkerLost
from accumrun.rundir.atomic import write_text_atomically
from accumrun.rundir.layout import prepare_run_dir, write_features, write_labels
from accumrun.rundir.metrics import keep_metrics, metrics_before
from accumrun.rundir.status import RunStatus
from accumrun.rundir.tensorboard import TensorBoardLog
from accumrun.training.autosub import choose_subdivisions
from accumrun.training.checkpoints import CheckpointStore, Position
from accumrun.training.console import describe_setup, device_name
from accumrun.training.controls import Controls
from accumrun.training.distribute import PEER_ERRORS, describe_strategy, is_chief, lost_worker
from accumrun.training.log import RunLog
from accumrun.training.loop import EpochLoop
from accumrun.training.probe import fits_in_fresh_process
from accumrun.training.saving import save_trained_model
from accumrun.training.setup import TrainingSetup, build_training
from accumrun.training.signals import StopRequests


@dataclass
class RunResult:
    """What a finished run leaves: its directory, its per-epoch metrics and the trained model."""

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
    """Train as configured; write ``run.json``, ``config.yaml``, ``metrics.jsonl``, ``checkpoints/``,
    ``model.keras`` and ``tensorboard/`` in ``run_dir``.

    With ``resume``, continue the run in ``run_dir`` from its latest checkpoint instead of starting one; the
    caller has checked that ``config`` is compatible with the run's. ``subdivisions: auto`` is settled first,
    and the value chosen goes into ``config.yaml`` and ``run.json``. Everything that can be refused (data,
    model, optimizer, sizes, the run directory, the checkpoint) is checked before anything is written.

    ``strategy`` is the ``tf.distribute`` strategy that ``config.distribute`` asks for (see
    :func:`accumrun.training.distribute.create_strategy`), or None for one device. On a multi-worker run only
    the chief writes ``run_dir``; the other workers train alike in a scratch folder under the system temp
    folder, removed when they end. ``run_dir`` is on a filesystem that every worker sees: a resumed worker
    restores the chief's latest checkpoint from it, so all continue from the same batch boundary.

    Raises:
        ConfigError, DataError: the config or the data is refused; nothing was written.
        Interrupted: SIGINT or SIGTERM stopped the run after a checkpoint.
        TrainingDiverged: the loss or a gradient became NaN or Inf.
        WorkerLost: a worker of a multi-worker run stopped answering; the last checkpoint is intact.
    """
    if is_chief(strategy):
        return _train(config, run_dir, strategy, quiet=quiet, run_home=run_dir, resume=resume, overwrite=overwrite)
    scratch = Path(tempfile.mkdtemp(prefix="accumrun-worker-"))
    try:
        return _train(config, scratch / "run", strategy, quiet=quiet, run_home=run_dir, resume=resume)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _train(
    config: Config,
    run_dir: Path,
    strategy: tf.distribute.Strategy | None,
    *,
    quiet: bool = False,
    run_home: Path,
    resume: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """Train into ``run_dir``: ``run_home``, the run's directory, or on a worker other than the chief a scratch
    folder; with ``resume``, from the latest checkpoint in ``run_home``."""
    echo: Callable[[str], None] = (lambda _: None) if quiet else click.echo
    setup = build_training(config, strategy)
    config = setup.config
    details: dict[str, Any] = {}
    if setup.batch_norm.layers:
        # compare reads it: with BatchNorm, subdivided and plain runs are not expected to match.
        details["batch_norm"] = {"layers": len(setup.batch_norm.layers), "mode": setup.batch_norm.mode}
    subdivisions = config.training.fixed_subdivisions
    if subdivisions is None:
        subdivisions, train_step, tried = _settle_auto(setup, echo)
        # The settled count is what config.yaml records and what a resumed run keeps.
        config = setup.config = config.with_subdivisions(subdivisions)
        details["subdivisions_auto"] = {"chosen": subdivisions, "tried": tried}
    else:
        train_step = setup.make_step(subdivisions)
    batches_per_epoch, _ = epoch_batches(setup.dataset.train_size, setup.batch_size, config.training.drop_remainder)
    state = {
        "model": setup.model.variables,
        "optimizer": setup.optimizer.variables,
        "metrics": setup.train_metrics.variables,
    }
    store = CheckpointStore(run_dir / "checkpoints", config.output.keep_checkpoints, batches_per_epoch, state)
    metric_names = setup.objective.metric_names
    logged = ["loss", *metric_names]
    controls = Controls(config, logged + [f"val_{name}" for name in logged] if setup.dataset.val_size else logged)
    if resume:
        source = CheckpointStore(run_home / "checkpoints", config.output.keep_checkpoints, batches_per_epoch, state)
        position, rows = _restore(source, setup, run_home)
        if run_home == run_dir:
            # The rows after the checkpoint will be logged again.
            keep_metrics(run_dir, rows)
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
        # The controls' state is a function of the rows: replayed, it is what the interrupted run had.
        controls.replay(rows)
    else:
        prepare_run_dir(run_dir, overwrite)
        position, rows = Position(), []
    write_text_atomically(run_dir / "config.yaml", config.to_yaml())
    labels = setup.dataset.labels
    if labels is not None:
        write_labels(run_dir, labels)
    if setup.dataset.features is not None:
        write_features(run_dir, setup.dataset.features)
    status = RunStatus(run_dir / "run.json", resumed=resume, details=details)
    output = config.output
    log = RunLog(
        run_dir,
        epochs=config.training.epochs,
        rows=rows,
        tensorboard=TensorBoardLog(
            run_dir,
            output.tensorboard,
            output.log_every_updates,
            setup.optimizer.iterations,
            metric_names,
        ),
        metric_names=metric_names,
        echo=echo,
    )
    loop = EpochLoop(
        setup=setup,
        train_step=train_step,
        subdivisions=subdivisions,
        run_dir=run_dir,
        run_home=run_home,
        store=store,
        log=log,
        controls=controls,
        echo=echo,
        show_progress=not quiet,
    )
    _announce(setup, run_dir, position, echo)
    try:
        with StopRequests() as stops:
            stopped = loop.run(position, stops)
        compiled = save_trained_model(setup, run_dir / "model.keras")
        echo(f"saved {run_dir / 'model.keras'}")
        note = compiled.describe()
        if note is not None:
            echo(note)
    except Interrupted as stop:
        status.end("interrupted", stop.reason)
        raise
    except PEER_ERRORS as error:
        lost = lost_worker(error, strategy)
        if lost is None:
            status.end("failed", str(error) or type(error).__name__)
            raise
        after = (
            f"the last checkpoint is intact: restart every worker with --resume {run_home}"
            if CheckpointStore(run_home / "checkpoints", keep=1).latest() is not None
            else "there is no checkpoint yet: start the run again"
        )
        reason = f"{lost} stopped answering (distribute.timeout_seconds: {config.distribute.timeout_seconds}); {after}"
        status.end("interrupted", reason)
        raise WorkerLost(reason) from None
    except KeyboardInterrupt:
        status.end("interrupted", "stopped at once by a second Ctrl-C; the last checkpoint is intact")
        raise
    except BaseException as error:
        status.end("failed", str(error) or type(error).__name__)
        raise
    status.end("completed", stopped)
    return RunResult(run_dir, log.rows, setup.model)


def _settle_auto(setup: TrainingSetup, echo: Callable[[str], None]) -> tuple[int, TrainStep, list[int]]:
    """Choose ``subdivisions: auto`` on the first batch; return the count, its step and the counts tried."""
    x, y = setup.first_batch()
    config = setup.config
    choice = choose_subdivisions(
        setup.make_step,
        [*setup.model.variables, *setup.optimizer.variables, *setup.train_metrics.variables],
        x,
        y,
        config.training.max_sub_batch,
        lambda subdivisions: fits_in_fresh_process(config, subdivisions),
        echo,
    )
    echo(f"subdivisions: auto chose {choice.subdivisions} (tried {', '.join(map(str, choice.tried))})")
    return choice.subdivisions, choice.step, choice.tried


def _restore(store: CheckpointStore, setup: TrainingSetup, run_dir: Path) -> tuple[Position, list[dict[str, Any]]]:
    """Load the latest checkpoint; drop the metrics rows logged after it (they will be logged again)."""
    checkpoint = store.latest()
    if checkpoint is None:
        raise ConfigError("--resume", "holds no checkpoint to resume from", str(run_dir))
    position = store.load(checkpoint)
    rows = metrics_before(run_dir, position.epoch)
    stopped = next((row["stopped"] for row in rows if "stopped" in row), None)
    if stopped is not None:
        raise ConfigError("--resume", f"the run ended by {stopped}; start a new run to train further", str(run_dir))
    epochs = setup.config.training.epochs
    if position.epoch >= epochs:
        noun = "epoch" if epochs == 1 else "epochs"
        raise ConfigError(
            "--resume",
            f"the run has finished its {epochs} {noun}; pass --epochs N (more than {epochs}) to train further",
            str(run_dir),
        )
    return position, rows


def _announce(setup: TrainingSetup, run_dir: Path, position: Position, echo: Callable[[str], None]) -> None:
    """The startup summary: versions and device, the strategy, the derived sizes, where a resumed run picks up."""
    echo(f"accumrun {__version__} | TensorFlow {tf.__version__} on {device_name()} | run dir {run_dir}")
    if setup.strategy is not None:
        echo(f"distribute {describe_strategy(setup.strategy)}")
    echo("\n".join(describe_setup(setup)))
    if position.epoch or position.batch:
        echo(f"resuming at epoch {position.epoch + 1}, batch {position.batch + 1}")
