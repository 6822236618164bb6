"""What a run prints: the setup summary, a progress bar per epoch and one line per epoch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import progressbar
import tensorflow as tf

from accumrun.config.schema import Watched
from accumrun.core.sub_batches import describe_plan, replica_sub_batch_sizes
from accumrun.data.dataset import per_class
from accumrun.data.section import DataSection
from accumrun.data.vocabulary import learned_line
from accumrun.kinds import CacheMode, Precision
from accumrun.models.lora import describe_adaptation
from accumrun.rundir.metrics import EpochRow
from accumrun.training.cadence import CALL_SECONDS
from accumrun.training.hooks import BatchEnd, Hook
from accumrun.training.measurements import measurement_lines
from accumrun.training.setup import TrainingSetup


def device_name() -> str:
    """``CPU``, or the number of GPUs TensorFlow sees."""
    gpus = tf.config.list_logical_devices("GPU")
    return f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}" if gpus else "CPU"


PRECISIONS = {
    Precision.MIXED_BFLOAT16: "mixed_bfloat16: layers compute in bfloat16, variables stay float32",
    Precision.MIXED_FLOAT16: "mixed_float16: layers compute in float16 under a loss scale, variables stay float32",
    Precision.FLOAT64: "float64: variables, sums, losses and metrics in float64",
}
"""The startup line of each precision but the default, float32."""


def describe_setup(setup: TrainingSetup) -> list[str]:
    """The derived numbers of a run, as lines: the data, model, loss and metrics, batch plan and optimizer."""
    config, dataset, model = setup.config, setup.fed.dataset, setup.trained.model
    shape = "x".join(str(d) for d in dataset.sample_shape)
    parameters = model.count_params()
    stepped = setup.stepped
    subdivisions = stepped.subdivisions or 1
    frozen = ""
    if getattr(config.model, "freeze_base", False):
        frozen = f" ({sum(int(np.prod(v.shape)) for v in model.trainable_variables):,} trainable: the base is frozen)"
    return [
        f"data {dataset.name}: {dataset.train_size:,} training + {dataset.val_size:,} validation samples of shape "
        f"{shape}, {dataset.describe_targets()}",
        _input_line(setup),
        *_vocabulary_lines(setup),
        *_weights_lines(setup),
        f"model {config.model.name}: {parameters:,} parameters{frozen}",
        *([f"precision {PRECISIONS[precision]}"] if (precision := config.training.precision) in PRECISIONS else []),
        *describe_adaptation(config.model, model),
        *setup.trained.objective.describe(),
        _plan(setup),
        # The fewest samples a replica's sub-batch of a full batch holds.
        *stepped.batch_norm.describe(
            min(replica_sub_batch_sizes(setup.fed.batch_size, stepped.replicas, subdivisions))
        ),
        *(stepped.draws.describe_off("L-BFGS") if stepped.spec.inference_mode else stepped.draws.describe()),
        *([setup.trained.remat] if setup.trained.remat else []),
        _optimizer_line(setup),
    ]


def _optimizer_line(setup: TrainingSetup) -> str:
    """``optimizer adam, learning rate 0.001, 10 epochs, seed 0``; L-BFGS's with its history, line search and limits."""
    config = setup.config
    return config.optimizer.describe(_count(config.training.epochs, "epoch"), config.seed)


def _vocabulary_lines(setup: TrainingSetup) -> list[str]:
    """A learned vocabulary's size, against the most it may have, and where the run keeps it."""
    line = learned_line(setup.config.data)
    return [] if line is None else [line]


def _weights_lines(setup: TrainingSetup) -> list[str]:
    """What weights the loss: ``data.weight`` (training and validation) or the class weights (training only)."""
    weight, class_weight = getattr(setup.config.data, "weight", None), setup.config.training.class_weight
    if weight is not None:
        return [f"sample weights from data.weight {weight!r} (training and validation loss; metrics unweighted)"]
    dataset = setup.fed.dataset
    if class_weight is None or dataset.labels is None:
        return []
    pairs = list(zip(dataset.labels, per_class(class_weight, dataset), strict=True))
    shown = ", ".join(f"{name} {value:.4g}" for name, value in pairs[:10]) + (", ..." if len(pairs) > 10 else "")
    return [
        f"class weights ({class_weight if isinstance(class_weight, str) else 'given'}; training loss only): {shown}"
    ]


def _input_line(setup: TrainingSetup) -> str:
    """How samples reach the model: dtype, storage, the input layers, the augmentation, and the feed (with why)."""
    fed, trained, data = setup.fed, setup.trained, setup.config.data
    dataset = fed.dataset
    held = "streamed from files" if dataset.streamed else "held in memory"
    parts = [f"input {dataset.dtype.name} {held}"]
    if dataset.skipped:
        parts.append(f"{_count(dataset.skipped, 'file')} skipped (not images)")
    steps = ([f"x {trained.rescale:.6g}"] if trained.rescale != 1.0 else []) + (["normalize"] if data.normalize else [])
    if trained.preprocess is not None:
        steps.append(f"{setup.config.model.name}'s preprocess_input")
    parts.append(f"scaled in the model ({', '.join(steps)})" if steps else "not scaled")
    if fed.augmentation is not None:
        names = ", ".join(entry.name for entry in data.augment)
        shape = "x".join(str(d) for d in fed.augmentation.output_shape)
        parts.append(f"augment {names} -> {shape}")
    parts += _cache_and_padding(data)
    parts.append(f"feed {fed.feed.value} ({fed.feed_choice.reason})")
    if fed.several_updates_per_call:
        per_call = setup.config.training.updates_per_call
        auto = f"about {CALL_SECONDS:g} s of updates per call"
        parts.append(auto if per_call == "auto" else f"up to {per_call} updates per call")
    return "; ".join(parts)


def _cache_and_padding(data: DataSection) -> list[str]:
    """A disk cache, and bucketed padding, where the run has them: both change what a run reads and pads."""
    parts = []
    if getattr(data, "cache", None) is CacheMode.DISK:
        kept = "token file" if data.text_settings is not None else "decoded samples"
        parts.append(f"disk cache ({kept} under {getattr(data, 'cache_dir', '')})")
    if data.token_bucket is not None:
        parts.append(f"bucket {data.token_bucket} (a sub-batch padded to its longest text, a multiple of it)")
    return parts


def _plan(setup: TrainingSetup) -> str:
    fed, subdivisions = setup.fed, setup.stepped.subdivisions
    if subdivisions is None:
        return f"batch {fed.batch_size:,}; subdivisions: auto (the fewest that fit in memory, tried on the first batch)"
    train_size, drop_remainder = fed.dataset.train_size, setup.config.training.drop_remainder
    plan = describe_plan(train_size, fed.batch_size, subdivisions, drop_remainder, setup.stepped.replicas)
    if setup.config.training.batch_size != "full":
        return plan
    held_out = fed.dataset.val_size
    validation = f"{held_out:,} held out for validation" if held_out else "none held out for validation"
    return f"batch full = all {train_size:,} training samples ({validation}): {plan}"


class ProgressBars(Hook):
    """The progress bar of each epoch of more than one batch, moved after every call (on a terminal only)."""

    def __init__(self, batches_per_epoch: int, epochs: int) -> None:
        self._count = batches_per_epoch
        self._epochs = epochs
        self._bars: dict[int, progressbar.ProgressBar | None] = {}

    def on_batch_end(self, batches: BatchEnd) -> None:
        position = batches.position
        if self._count == 1:
            return
        if position.epoch not in self._bars:
            self.on_stop(None)
            self._bars[position.epoch] = self._bar(position.epoch, batches.first_batch)
        bar = self._bars[position.epoch]
        if bar is not None:
            bar.update(position.batch, loss=position.loss_sum / max(position.units, 1.0))
        if position.batch == self._count:
            self.on_stop(None)

    def on_stop(self, stopped: str | None) -> None:
        """Finish the open bars (before the run's last words, however it ends)."""
        for bar in self._bars.values():
            if bar is not None:
                bar.finish(dirty=True)
        self._bars.clear()

    def _bar(self, epoch: int, done: int) -> progressbar.ProgressBar | None:
        """A bar over the epoch's batches, ``done`` of them already; None when not on a terminal."""
        if not sys.stdout.isatty():
            return None
        widgets = [
            f"epoch {epoch + 1}/{self._epochs} ",
            progressbar.SimpleProgress(),
            " ",
            progressbar.Bar(),
            " ",
            progressbar.Variable("loss", format="loss {formatted_value}", precision=4),
            " ",
            progressbar.ETA(),
        ]
        bar = progressbar.ProgressBar(max_value=self._count, initial_value=done, widgets=widgets, fd=sys.stdout)
        return bar.start()


def epoch_line(row: EpochRow, epochs: int, metric_names: list[str]) -> str:
    """``epoch 3/10 | loss 0.4312 | accuracy 0.872 | val_loss ... | val_accuracy ... | 2.1 s | 4,870 samples/s``."""
    names = ["loss", *metric_names]
    if "val_loss" in row.figures:
        names += [f"val_{name}" for name in names]
    parts = [f"epoch {row.epoch}/{epochs}", *(f"{name} {_figure(name, row.figure(name))}" for name in names)]
    parts += measurement_lines(row.figures)
    if "evaluations" in row.figures:
        figures = row.figures
        parts.append(
            f"{_count(int(figures['evaluations']), 'evaluation')}, step {figures['step_length']:.3g}, "
            f"gradient norm {figures['gradient_norm']:.3g}"
        )
    measured = row.measure_seconds or 0.0
    parts += [f"{row.seconds - measured:.1f} s", f"{row.samples_per_second:,.0f} samples/s"]
    if measured:
        # The samples/s is training's alone, so the seconds beside it leave the measuring out.
        parts.append(f"measured in {measured:.1f} s")
    if row.skipped_batches:
        parts.append(f"{row.skipped_batches} batches skipped (non-finite)")
    if row.loss_scale_skips:
        parts.append(f"{row.loss_scale_skips} updates skipped by the loss scale")
    return " | ".join(parts)


def run_summary(
    rows: list[EpochRow], first_epoch: int, seconds: float, headline: Watched, model: Path, *, resumed: bool
) -> str:
    """``done: 5 epochs in 12.3 s | 4,870 samples/s after the first | best val_loss 0.4521 at epoch 4 | model
    runs/x/model.keras``: this session's epochs (from ``first_epoch``, 1-based), its mean speed after its first
    epoch (which traces the step), and the best ``headline`` figure of the whole run."""
    session = [row for row in rows if row.epoch >= first_epoch]
    if not resumed:
        epochs = _count(len(session), "epoch")
    else:
        epochs = f"epochs {first_epoch} to {session[-1].epoch}" if len(session) > 1 else f"epoch {first_epoch}"
    speeds = [row.samples_per_second for row in session[1:]]
    speed = (
        f"{sum(speeds) / len(speeds):,.0f} samples/s after the first"
        if speeds
        else f"{session[-1].samples_per_second:,.0f} samples/s"
    )
    parts = [f"done: {epochs} in {seconds:.1f} s", speed]
    watched = [row for row in rows if headline.monitor in row.logged]
    if watched:
        pick = min if headline.minimize else max
        best = pick(watched, key=lambda row: row.figure(headline.monitor))
        value = best.figure(headline.monitor)
        parts.append(f"best {headline.monitor} {_figure(headline.monitor, value)} at epoch {best.epoch}")
    parts.append(f"model {model}")
    return " | ".join(parts)


def _figure(name: str, value: float) -> str:
    # Losses and errors need more digits than accuracies to show progress late in a run.
    return f"{value:.4f}" if "loss" in name or "error" in name else f"{value:.3f}"


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
