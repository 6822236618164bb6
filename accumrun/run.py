"""The epoch loop and the run directory: data, model, optimizer and step, wired together and logged."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import keras
import numpy as np
import progressbar
import tensorflow as tf

from accumrun import __version__
from accumrun.batches import BatchFeeder
from accumrun.config import Config, TrainingConfig
from accumrun.data import Dataset, epoch_order, load_dataset
from accumrun.errors import ConfigError
from accumrun.models import build_model
from accumrun.optimizers import build_optimizer
from accumrun.split import describe_plan, sub_batch_sizes
from accumrun.step import make_eval_step, make_train_step, sparse_categorical_crossentropy
from accumrun.tensorboard import TensorBoardLog


class TrainingDiverged(click.ClickException):
    """The loss became NaN or Inf; training stopped."""

    exit_code = 1


class RunStatus:
    """``run.json``: whether the run is running, completed, interrupted or failed (and why), with its times
    and versions. Rewritten atomically, so it is always a complete JSON document."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._record: dict[str, Any] = {
            "status": "running",
            "reason": None,
            "started": datetime.now().isoformat(timespec="seconds"),
            "ended": None,
            "accumrun_version": __version__,
            "tensorflow_version": tf.__version__,
        }
        self._write()

    def end(self, status: str, reason: str | None = None) -> None:
        self._record.update(status=status, reason=reason, ended=datetime.now().isoformat(timespec="seconds"))
        self._write()

    def _write(self) -> None:
        partial = self._path.with_name(f".{self._path.name}.partial")
        partial.write_text(json.dumps(self._record, indent=2) + "\n")
        os.replace(partial, self._path)


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
    if training.subdivisions > batch_size:
        raise ConfigError(
            "training.subdivisions",
            f"cannot exceed the batch size ({batch_size:,} samples)",
            training.subdivisions,
        )
    return batch_size


def train(config: Config, run_dir: Path, *, quiet: bool = False) -> RunResult:
    """Train as configured; write ``run.json``, ``config.yaml``, ``metrics.jsonl``, ``model.keras``, ``tensorboard/``.

    Everything that can be refused (data, model, optimizer, sizes) is checked before ``run_dir`` is created.
    """
    echo = (lambda *_: None) if quiet else click.echo
    dataset = load_dataset(config.data, config.seed)
    batch_size = resolve_batch_size(config.training, dataset.train_size)
    keras.utils.set_random_seed(config.seed)
    model = build_model(config.model, dataset.sample_shape, dataset.classes)
    optimizer = build_optimizer(config.optimizer)
    train_step = make_train_step(model, sparse_categorical_crossentropy, optimizer, config.training.subdivisions)
    eval_step = make_eval_step(model, sparse_categorical_crossentropy)
    _create_run_dir(run_dir)
    (run_dir / "config.yaml").write_text(config.to_yaml())
    status = RunStatus(run_dir / "run.json")
    try:
        metrics = _train_epochs(
            config, dataset, model, optimizer, train_step, eval_step, batch_size, run_dir, echo, quiet
        )
    except KeyboardInterrupt:
        status.end("interrupted", "stopped by the user")
        raise
    except BaseException as error:
        status.end("failed", str(error) or type(error).__name__)
        raise
    status.end("completed")
    return RunResult(run_dir, metrics, model)


def _train_epochs(
    config: Config,
    dataset: Dataset,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    train_step: Callable,
    eval_step: Callable,
    batch_size: int,
    run_dir: Path,
    echo: Callable[[str], None],
    quiet: bool,
) -> list[dict[str, Any]]:
    """The epoch loop proper; returns the metrics rows after saving the model."""
    subdivisions = config.training.subdivisions

    echo(f"accumrun {__version__} | TensorFlow {tf.__version__} on {_device_name()} | run dir {run_dir}")
    echo("\n".join(describe_setup(config, dataset, model, batch_size)))
    feeder = BatchFeeder(dataset.x_train, dataset.y_train)
    # Evaluation batches are no larger than a sub-batch, so validation never needs more memory than training.
    eval_batch_size = max(sub_batch_sizes(batch_size, subdivisions))
    val_feeder = BatchFeeder(dataset.x_val, dataset.y_val) if dataset.val_size else None
    epochs = config.training.epochs
    tensorboard = TensorBoardLog(
        run_dir, config.output.tensorboard, config.output.log_every_updates, optimizer.iterations
    )
    log_update = tensorboard.update if tensorboard.logs_updates else None

    metrics: list[dict[str, Any]] = []
    for epoch in range(epochs):
        started = time.perf_counter()
        order = epoch_order(dataset.train_size, config.seed, epoch, config.data.shuffle)
        batches = feeder.batches(order, batch_size, config.training.drop_remainder)
        loss_sum, correct, samples = _train_epoch(train_step, batches, epoch, epochs, quiet, log_update)
        train_seconds = time.perf_counter() - started
        row: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": loss_sum / samples,
            "accuracy": correct / samples,
        }
        if val_feeder is not None:
            val_order = np.arange(dataset.val_size)
            row["val_loss"], row["val_accuracy"] = _evaluate(eval_step, val_feeder.batches(val_order, eval_batch_size))
        row.update(
            seconds=time.perf_counter() - started,
            samples_per_second=samples / train_seconds,
            batch_size=batch_size,
            subdivisions=subdivisions,
            sub_batch_size=eval_batch_size,
            optimizer_steps=int(optimizer.iterations.numpy()),
            learning_rate=float(optimizer.learning_rate),
            **_peak_memory_mib(),
        )
        metrics.append(row)
        tensorboard.epoch(row)
        _append_jsonl(run_dir / "metrics.jsonl", row)
        echo(_epoch_line(row, epochs))

    tensorboard.close()
    _save_model_atomically(model, run_dir / "model.keras")
    echo(f"saved {run_dir / 'model.keras'}")
    return metrics


def _train_epoch(
    train_step,
    batches: tf.data.Dataset,
    epoch: int,
    epochs: int,
    quiet: bool,
    on_update: Callable[[float], None] | None = None,
) -> tuple[float, int, int]:
    """One pass over the batches: ``(sum of per-sample losses, correct predictions, samples)``."""
    loss_sum, correct, samples = 0.0, 0, 0
    count = int(batches.cardinality())
    bar = _progress_bar(count, epoch, epochs) if not quiet and sys.stdout.isatty() else None
    for index, (x, y) in enumerate(batches):
        batch_loss, batch_correct = train_step(x, y)
        batch_loss = float(batch_loss)
        if not math.isfinite(batch_loss):
            raise TrainingDiverged(
                f"training diverged: the loss is {batch_loss} at epoch {epoch + 1}, batch {index + 1}"
            )
        loss_sum += batch_loss
        correct += int(batch_correct)
        if on_update is not None:
            on_update(batch_loss / int(x.shape[0]))
        samples += int(x.shape[0])
        if bar is not None:
            bar.update(index + 1, loss=loss_sum / samples)
    if bar is not None:
        bar.finish(dirty=True)
    return loss_sum, correct, samples


def _evaluate(eval_step, batches: tf.data.Dataset) -> tuple[float, float]:
    loss_sum, correct, samples = 0.0, 0, 0
    for x, y in batches:
        batch_loss, batch_correct = eval_step(x, y)
        loss_sum += float(batch_loss)
        correct += int(batch_correct)
        samples += int(x.shape[0])
    return loss_sum / samples, correct / samples


def _progress_bar(count: int, epoch: int, epochs: int) -> progressbar.ProgressBar:
    widgets = [
        f"epoch {epoch + 1}/{epochs} ",
        progressbar.SimpleProgress(),
        " ",
        progressbar.Bar(),
        " ",
        progressbar.Variable("loss", format="loss {formatted_value}", precision=4),
        " ",
        progressbar.ETA(),
    ]
    return progressbar.ProgressBar(max_value=count, widgets=widgets, fd=sys.stdout).start()


def _create_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError("output.run_dir", "already exists and is not empty; choose another --run-dir", str(run_dir))
    run_dir.mkdir(parents=True, exist_ok=True)


def _append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as file:
        file.write(json.dumps(row) + "\n")
        file.flush()
        os.fsync(file.fileno())


def _save_model_atomically(model: keras.Model, path: Path) -> None:
    # Keras insists on the .keras suffix; a rename is atomic, so a killed run never leaves a truncated model.
    partial = path.with_name(f".{path.stem}.partial.keras")
    model.save(partial)
    os.replace(partial, path)


def _peak_memory_mib() -> dict[str, float]:
    """The process's peak resident memory and, on a GPU, the device's peak allocation, in MiB, so far."""
    # Linux reports ru_maxrss in KiB.
    peaks = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if tf.config.list_logical_devices("GPU"):
        peaks["peak_device_mib"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return peaks


def _device_name() -> str:
    gpus = tf.config.list_logical_devices("GPU")
    return f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}" if gpus else "CPU"


def describe_setup(config: Config, dataset: Dataset, model: keras.Model, batch_size: int) -> list[str]:
    """The derived numbers of a run, as lines: data sizes, parameter count, batch plan and optimizer."""
    shape = "x".join(str(d) for d in dataset.sample_shape)
    learning_rate = config.optimizer.learning_rate
    rate = f"{learning_rate:g}" if isinstance(learning_rate, float) else f"schedule {learning_rate.name}"
    return [
        f"data {dataset.name}: {dataset.train_size:,} training + {dataset.val_size:,} validation samples of shape "
        f"{shape}, {dataset.classes} classes",
        f"model {config.model.name}: {model.count_params():,} parameters",
        describe_plan(dataset.train_size, batch_size, config.training.subdivisions, config.training.drop_remainder),
        f"optimizer {config.optimizer.name}, learning rate {rate}, {config.training.epochs} epochs, seed {config.seed}",
    ]


def _epoch_line(row: dict[str, Any], epochs: int) -> str:
    parts = [f"epoch {row['epoch']}/{epochs}", f"loss {row['loss']:.4f}", f"acc {row['accuracy']:.3f}"]
    if "val_loss" in row:
        parts += [f"val_loss {row['val_loss']:.4f}", f"val_acc {row['val_accuracy']:.3f}"]
    parts += [f"{row['seconds']:.1f} s", f"{row['samples_per_second']:,.0f} samples/s"]
    return " | ".join(parts)
