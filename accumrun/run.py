"""The epoch loop and the run directory: data, model, optimizer and step, wired together, logged and resumable."""

from __future__ import annotations

import math
import resource
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import keras
import numpy as np
import tensorflow as tf

from accumrun import __version__
from accumrun.autosub import AutoChoice, choose_subdivisions
from accumrun.batches import BatchFeeder
from accumrun.checkpoints import CheckpointStore, Position
from accumrun.config import Config, TrainingConfig
from accumrun.console import describe_setup, device_name, epoch_line, progress_bar
from accumrun.data import Dataset, epoch_order, load_dataset
from accumrun.distribute import create_strategy, describe_strategy, is_chief, strategy_scope
from accumrun.errors import ConfigError
from accumrun.interrupts import StopRequests
from accumrun.models import build_model
from accumrun.optimizers import build_optimizer
from accumrun.probe import fits_in_fresh_process
from accumrun.replicated_step import make_replicated_train_step
from accumrun.rundir import RunStatus, append_metrics, keep_metrics_before, prepare_run_dir, save_model_atomically
from accumrun.split import replica_sub_batch_sizes
from accumrun.step import make_eval_step, make_train_step, sparse_categorical_crossentropy
from accumrun.tensorboard import TensorBoardLog

LOSS = sparse_categorical_crossentropy


class TrainingDiverged(click.ClickException):
    """The loss or a gradient became NaN or Inf, and ``training.on_nonfinite`` is ``stop``."""

    exit_code = 1


class TrainingInterrupted(click.ClickException):
    """SIGINT or SIGTERM stopped the run at a batch boundary, after a checkpoint; exits 128 + the signal."""

    def __init__(self, signal_number: int, reason: str, resume_command: str) -> None:
        super().__init__(f"{reason}\nresume with: {resume_command}")
        self.exit_code = 128 + signal_number
        self.reason = reason

    def show(self, file: Any = None) -> None:
        # A stop the user asked for is not an error; say where the run stands and how to go on.
        click.echo(self.message, err=True)


@dataclass
class RunResult:
    """What a finished run leaves: its directory, its per-epoch metrics and the trained model."""

    run_dir: Path
    metrics: list[dict[str, Any]]
    model: keras.Model


def resolve_run_dir(template: str, config_name: str) -> Path:
    """Fill ``{config_name}`` and ``{timestamp}`` in ``output.run_dir``."""
    try:
        return Path(template.format(config_name=config_name, timestamp=datetime.now().strftime("%Y%m%d-%H%M%S")))
    except (KeyError, IndexError, ValueError) as error:
        raise ConfigError(
            "output.run_dir", f"bad placeholder {error}; use {{config_name}} and {{timestamp}}", template
        ) from None


def resolve_batch_size(training: TrainingConfig, train_size: int) -> int:
    """The batch size in samples: ``full`` is the whole training set. A batch larger than it is refused."""
    batch_size = train_size if training.batch_size == "full" else training.batch_size
    if batch_size > train_size:
        raise ConfigError(
            "training.batch_size",
            f"is larger than the {train_size:,} training samples; use batch_size: full for full-batch training",
            training.batch_size,
        )
    if isinstance(training.subdivisions, int) and training.subdivisions > batch_size:
        raise ConfigError(
            "training.subdivisions",
            f"cannot exceed the batch size ({batch_size:,} samples)",
            training.subdivisions,
        )
    return batch_size


@dataclass
class TrainingSetup:
    """What a run trains: the data, the batch size, the model and optimizer, and a step factory."""

    dataset: Dataset
    batch_size: int
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    make_step: Callable[[int], Callable]
    """``make_step(subdivisions)`` compiles the train step (see :func:`accumrun.step.make_train_step`)."""


def build_training(config: Config, strategy: tf.distribute.Strategy | None = None) -> TrainingSetup:
    """Load the data and build the model (under ``training.precision``) and the optimizer, from the seed.

    With a ``strategy``, the variables are made in its scope, to live on every replica, and the steps are
    replicated ones (:mod:`accumrun.replicated_step`).
    """
    dataset = load_dataset(config.data, config.seed)
    batch_size = resolve_batch_size(config.training, dataset.train_size)
    keras.utils.set_random_seed(config.seed)
    precision = config.training.precision
    previous_policy = keras.mixed_precision.dtype_policy()
    with strategy_scope(strategy):
        # The policy is global in Keras; layers keep the one they were built with, so restore it at once.
        keras.mixed_precision.set_dtype_policy(precision)
        try:
            model = build_model(config.model, dataset.sample_shape, dataset.classes)
        finally:
            keras.mixed_precision.set_dtype_policy(previous_policy)
        optimizer = build_optimizer(config.optimizer)
        if precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        # Built now, so its state exists before the first step (checkpoints and auto's tries restore it).
        optimizer.build(model.trainable_variables)

    def make_step(subdivisions: int) -> Callable:
        jit_compile = config.training.jit_compile
        with strategy_scope(strategy):
            if strategy is None:
                return make_train_step(model, LOSS, optimizer, subdivisions, jit_compile)
            return make_replicated_train_step(strategy, model, LOSS, optimizer, subdivisions, jit_compile)

    return TrainingSetup(dataset, batch_size, model, optimizer, make_step)


def first_batch(config: Config, dataset: Dataset, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The first batch of the first epoch, as the run will see it."""
    index = epoch_order(dataset.train_size, config.seed, 0, config.data.shuffle)[:batch_size]
    return tf.constant(dataset.x_train[index]), tf.constant(dataset.y_train[index])


def train(
    config: Config, run_dir: Path, *, quiet: bool = False, resume: bool = False, overwrite: bool = False
) -> RunResult:
    """Train as configured; write ``run.json``, ``config.yaml``, ``metrics.jsonl``, ``checkpoints/``,
    ``model.keras`` and ``tensorboard/`` in ``run_dir``.

    With ``resume``, continue the run in ``run_dir`` from its latest checkpoint instead of starting one; the
    caller has checked that ``config`` is compatible with the run's. ``subdivisions: auto`` is settled first,
    and the value chosen goes into ``config.yaml`` and ``run.json``. Everything that can be refused (data,
    model, optimizer, sizes, the run directory, the checkpoint) is checked before anything is written.

    On a multi-worker run (``distribute.strategy: multi_worker``) only the chief writes ``run_dir``; the other
    workers train alike in a scratch folder under the system temp folder, removed when they end.
    """
    if resume and config.distribute.strategy == "multi_worker":
        raise ConfigError("--resume", "is not supported on a multi-worker run; start a new run", str(run_dir))
    strategy = create_strategy(config.distribute)
    if is_chief(strategy):
        return _train(config, run_dir, strategy, quiet=quiet, resume=resume, overwrite=overwrite)
    scratch = Path(tempfile.mkdtemp(prefix="accumrun-worker-"))
    try:
        return _train(config, scratch / "run", strategy, quiet=quiet)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _train(
    config: Config,
    run_dir: Path,
    strategy: tf.distribute.Strategy | None,
    *,
    quiet: bool = False,
    resume: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """:func:`train` in ``run_dir``, with ``strategy`` (None: one device)."""
    echo = (lambda *_: None) if quiet else click.echo
    setup = build_training(config, strategy)
    model, optimizer = setup.model, setup.optimizer
    details: dict[str, Any] = {}
    if config.training.subdivisions == "auto":
        auto = _choose_subdivisions(config, setup, echo)
        config = config.model_copy(
            update={"training": config.training.model_copy(update={"subdivisions": auto.subdivisions})}
        )
        details["subdivisions_auto"] = {"chosen": auto.subdivisions, "tried": auto.tried}
        train_step = auto.step
    else:
        train_step = setup.make_step(config.training.subdivisions)
    store = CheckpointStore(run_dir / "checkpoints", config.output.keep_checkpoints)
    if resume:
        position, metrics = _restore(store, model, optimizer, config, run_dir)
    else:
        prepare_run_dir(run_dir, overwrite)
        position, metrics = Position(), []
    (run_dir / "config.yaml").write_text(config.to_yaml())
    status = RunStatus(run_dir / "run.json", resumed=resume, details=details)
    eval_step = make_eval_step(model, LOSS)
    trainer = _Trainer(
        config,
        setup.dataset,
        model,
        optimizer,
        train_step,
        eval_step,
        setup.batch_size,
        run_dir,
        store,
        quiet,
        metrics,
        strategy,
    )
    try:
        with StopRequests() as stops:
            trainer.run(position, stops)
    except TrainingInterrupted as stop:
        status.end("interrupted", stop.reason)
        raise
    except KeyboardInterrupt:
        status.end("interrupted", "stopped at once by a second Ctrl-C; the last checkpoint is intact")
        raise
    except BaseException as error:
        status.end("failed", str(error) or type(error).__name__)
        raise
    status.end("completed")
    return RunResult(run_dir, trainer.metrics, model)


def _choose_subdivisions(config: Config, setup: TrainingSetup, echo: Callable[[str], None]) -> AutoChoice:
    x, y = first_batch(config, setup.dataset, setup.batch_size)
    state = [*setup.model.variables, *setup.optimizer.variables]
    choice = choose_subdivisions(
        setup.make_step,
        state,
        x,
        y,
        config.training.max_sub_batch,
        lambda subdivisions: fits_in_fresh_process(config, subdivisions),
        echo,
    )
    echo(f"subdivisions: auto chose {choice.subdivisions} (tried {', '.join(map(str, choice.tried))})")
    return choice


def _restore(
    store: CheckpointStore,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    config: Config,
    run_dir: Path,
) -> tuple[Position, list[dict[str, Any]]]:
    """Load the latest checkpoint; drop the metrics rows logged after it (they will be logged again)."""
    checkpoint = store.latest()
    if checkpoint is None:
        raise ConfigError("--resume", "holds no checkpoint to resume from", str(run_dir))
    position = store.load(checkpoint, model, optimizer)
    epochs = config.training.epochs
    if position.epoch >= epochs:
        raise ConfigError(
            "--resume",
            f"the run has finished its {epochs} epochs; pass --epochs N (more than {epochs}) to train further",
            str(run_dir),
        )
    return position, keep_metrics_before(run_dir, position.epoch)


@dataclass
class _Trainer:
    """The epoch loop of one run: batches through the step, metrics rows, checkpoints and graceful stops."""

    config: Config
    dataset: Dataset
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    train_step: Callable
    eval_step: Callable
    batch_size: int
    run_dir: Path
    store: CheckpointStore
    quiet: bool
    metrics: list[dict[str, Any]]
    strategy: tf.distribute.Strategy | None = None

    def __post_init__(self) -> None:
        self.echo: Callable[[str], None] = (lambda *_: None) if self.quiet else click.echo
        training, dataset = self.config.training, self.dataset
        self._feeder = BatchFeeder(dataset.x_train, dataset.y_train, self.batch_size, training.drop_remainder)
        self._replicas = self.strategy.num_replicas_in_sync if self.strategy is not None else 1
        # The largest sub-batch one device runs: the batch is dealt out to the replicas before it is cut.
        self._sub_batch_size = max(replica_sub_batch_sizes(self.batch_size, self._replicas, training.subdivisions))
        # Evaluation batches are no larger than a sub-batch, so validation never needs more memory than training.
        self._val_feeder = BatchFeeder(dataset.x_val, dataset.y_val, self._sub_batch_size) if dataset.val_size else None
        self._loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        output = self.config.output
        self._tensorboard = TensorBoardLog(
            self.run_dir, output.tensorboard, output.log_every_updates, self.optimizer.iterations
        )

    def run(self, position: Position, stops: StopRequests) -> None:
        """Train from ``position`` to the last epoch, then save the model."""
        config = self.config
        echo = self.echo
        echo(f"accumrun {__version__} | TensorFlow {tf.__version__} on {device_name()} | run dir {self.run_dir}")
        if self.strategy is not None:
            echo(f"distribute {describe_strategy(self.strategy)}")
        echo("\n".join(describe_setup(config, self.dataset, self.model, self.batch_size, self._replicas)))
        if position.epoch or position.batch:
            echo(f"resuming at epoch {position.epoch + 1}, batch {position.batch + 1}")
        while position.epoch < config.training.epochs:
            self._train_epoch(position, stops)
            row = self._epoch_row(position)
            self.metrics.append(row)
            self._tensorboard.epoch(row)
            append_metrics(self.run_dir, row)
            echo(epoch_line(row, config.training.epochs))
            position = Position(epoch=position.epoch + 1)
            checkpoint = self.store.save(self.model, self.optimizer, position)
            self._stop_if_requested(stops, position, checkpoint)
        self._tensorboard.close()
        save_model_atomically(self.model, self.run_dir / "model.keras")
        echo(f"saved {self.run_dir / 'model.keras'}")

    def _train_epoch(self, position: Position, stops: StopRequests) -> None:
        """Run the epoch's remaining batches, adding them to ``position``."""
        training = self.config.training
        every = self.config.output.checkpoint_every_updates
        order = epoch_order(self.dataset.train_size, self.config.seed, position.epoch, self.config.data.shuffle)
        batches = self._feeder.batches(order, skip=position.batch)
        bar = None if self.quiet else progress_bar(self._feeder.count, position.epoch, training.epochs, position.batch)
        seconds_before, started = position.train_seconds, time.perf_counter()
        for x, y in batches:
            batch_loss, batch_correct, applied = self.train_step(x, y)
            position.batch += 1
            position.train_seconds = seconds_before + time.perf_counter() - started
            if not bool(applied):
                self._non_finite(position, float(batch_loss))
            else:
                batch_loss = float(batch_loss)
                position.loss_sum += batch_loss
                position.correct += int(batch_correct)
                position.samples += int(x.shape[0])
                if self._tensorboard.logs_updates:
                    self._tensorboard.update(batch_loss / int(x.shape[0]))
                if every and int(self.optimizer.iterations.numpy()) % every == 0:
                    self.store.save(self.model, self.optimizer, position)
            if bar is not None:
                bar.update(position.batch, loss=position.loss_sum / max(position.samples, 1))
            if stops.requested:
                if bar is not None:
                    bar.finish(dirty=True)
                self._stop_if_requested(stops, position, self.store.save(self.model, self.optimizer, position))
        if bar is not None:
            bar.finish(dirty=True)

    def _non_finite(self, position: Position, batch_loss: float) -> None:
        if self._loss_scaled and math.isfinite(batch_loss):
            # Overflow of the scaled float16 gradients: the optimizer lowered its loss scale; this is routine.
            position.loss_scale_skips += 1
            return
        what = f"the loss is {batch_loss}" if not math.isfinite(batch_loss) else "a gradient is NaN or Inf"
        where = f"at epoch {position.epoch + 1}, batch {position.batch}"
        if self.config.training.on_nonfinite == "skip_batch":
            position.skipped_batches += 1
            self.echo(f"{what} {where}; skipped that batch's update (training.on_nonfinite: skip_batch)")
            return
        latest = self.store.latest()
        kept = f"the last good checkpoint is {latest}" if latest else "no checkpoint was taken yet"
        raise TrainingDiverged(f"training diverged: {what} {where}; that update was not applied, and {kept}")

    def _stop_if_requested(self, stops: StopRequests, position: Position, checkpoint: Path) -> None:
        if not stops.requested:
            return
        name = signal.Signals(stops.signal_number).name
        reason = f"{name} at epoch {position.epoch + 1}, batch {position.batch}; saved {checkpoint}"
        command = f"accumrun train --resume {shlex.quote(str(self.run_dir))}"
        raise TrainingInterrupted(stops.signal_number, reason, command)

    def _epoch_row(self, position: Position) -> dict[str, Any]:
        """The metrics row of the epoch that ``position`` has just finished."""
        started = time.perf_counter()
        samples = max(position.samples, 1)
        row: dict[str, Any] = {
            "epoch": position.epoch + 1,
            "loss": position.loss_sum / samples if position.samples else math.nan,
            "accuracy": position.correct / samples,
        }
        if self._val_feeder is not None:
            row["val_loss"], row["val_accuracy"] = self._evaluate()
        row.update(
            seconds=position.train_seconds + time.perf_counter() - started,
            samples_per_second=position.samples / max(position.train_seconds, 1e-9),
            batch_size=self.batch_size,
            subdivisions=self.config.training.subdivisions,
            replicas=self._replicas,
            sub_batch_size=self._sub_batch_size,
            optimizer_steps=int(self.optimizer.iterations.numpy()),
            skipped_batches=position.skipped_batches,
            **({"loss_scale_skips": position.loss_scale_skips} if self._loss_scaled else {}),
            # Not float(): a Keras variable over a tf.distribute (mirrored) variable does not convert that way.
            learning_rate=float(keras.ops.convert_to_numpy(self.optimizer.learning_rate)),
            **_peak_memory_mib(),
        )
        return row

    def _evaluate(self) -> tuple[float, float]:
        loss_sum, correct = 0.0, 0
        for x, y in self._val_feeder.batches(np.arange(self.dataset.val_size)):
            batch_loss, batch_correct = self.eval_step(x, y)
            loss_sum += float(batch_loss)
            correct += int(batch_correct)
        return loss_sum / self.dataset.val_size, correct / self.dataset.val_size


def _peak_memory_mib() -> dict[str, float]:
    """The process's peak resident memory and, on a GPU, the device's peak allocation, in MiB, so far."""
    # Linux reports ru_maxrss in KiB.
    peaks = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if tf.config.list_logical_devices("GPU"):
        peaks["peak_device_mib"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return peaks
