"""What a run prints: the setup summary, a progress bar per epoch and one line per epoch."""

from __future__ import annotations

import sys
from typing import Any

import keras
import progressbar
import tensorflow as tf

from accumrun.config.schema import Config
from accumrun.core.split import describe_plan
from accumrun.data.dataset import Dataset


def device_name() -> str:
    """``CPU``, or the number of GPUs TensorFlow sees."""
    gpus = tf.config.list_logical_devices("GPU")
    return f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}" if gpus else "CPU"


def describe_setup(
    config: Config, dataset: Dataset, model: keras.Model, batch_size: int, replicas: int = 1
) -> list[str]:
    """The derived numbers of a run, as lines: data sizes, parameter count, batch plan (dealt out to
    ``replicas`` replicas) and optimizer."""
    shape = "x".join(str(d) for d in dataset.sample_shape)
    learning_rate = config.optimizer.learning_rate
    rate = f"{learning_rate:g}" if isinstance(learning_rate, float) else f"schedule {learning_rate.name}"
    return [
        f"data {dataset.name}: {dataset.train_size:,} training + {dataset.val_size:,} validation samples of shape "
        f"{shape}, {dataset.classes} classes",
        f"model {config.model.name}: {model.count_params():,} parameters",
        _plan(config, dataset.train_size, batch_size, replicas),
        f"optimizer {config.optimizer.name}, learning rate {rate}, {config.training.epochs} epochs, seed {config.seed}",
    ]


def _plan(config: Config, train_size: int, batch_size: int, replicas: int) -> str:
    training = config.training
    if training.fixed_subdivisions is None:
        return f"batch {batch_size:,}; subdivisions: auto (the fewest that fit in memory, tried on the first batch)"
    return describe_plan(train_size, batch_size, training.fixed_subdivisions, training.drop_remainder, replicas)


def progress_bar(count: int, epoch: int, epochs: int, done: int = 0) -> progressbar.ProgressBar | None:
    """A progress bar over an epoch's ``count`` batches, ``done`` of them already; None when not on a terminal."""
    if not sys.stdout.isatty():
        return None
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
    return progressbar.ProgressBar(max_value=count, initial_value=done, widgets=widgets, fd=sys.stdout).start()


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """``epoch 3/10 | loss 0.4312 | acc 0.872 | val_loss ... | 2.1 s | 4,870 samples/s``."""
    parts = [f"epoch {row['epoch']}/{epochs}", f"loss {row['loss']:.4f}", f"acc {row['accuracy']:.3f}"]
    if "val_loss" in row:
        parts += [f"val_loss {row['val_loss']:.4f}", f"val_acc {row['val_accuracy']:.3f}"]
    parts += [f"{row['seconds']:.1f} s", f"{row['samples_per_second']:,.0f} samples/s"]
    if row.get("skipped_batches"):
        parts.append(f"{row['skipped_batches']} batches skipped (non-finite)")
    if row.get("loss_scale_skips"):
        parts.append(f"{row['loss_scale_skips']} updates skipped by the loss scale")
    return " | ".join(parts)
