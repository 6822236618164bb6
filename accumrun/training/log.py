"""What a run records per epoch: the metrics row, and the log that writes it to ``metrics.jsonl`` and the console."""

from __future__ import annotations

import math
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from accumrun.rundir.metrics import EpochRow, append_metrics, sync_metrics
from accumrun.training.checkpoints import Position
from accumrun.training.console import epoch_line
from accumrun.training.hooks import EpochEnd, Hook


@dataclass(frozen=True)
class RowSizes:
    """The sizes every row of a run records (``sub_batch_size``: the largest one device runs)."""

    batch_size: int
    subdivisions: int
    replicas: int
    sub_batch_size: int


def epoch_row(
    position: Position,
    figures: dict[str, float],
    seconds: float,
    *,
    measure_seconds: float,
    sizes: RowSizes,
    optimizer_steps: int,
    loss_scaled: bool,
    learning_rate: float,
) -> EpochRow:
    """The row of the epoch that ``position`` has just finished, with the metrics and validation ``figures``; its
    throughput is this process's (for an epoch that a resume finished)."""
    rss, device = peak_memory_mib()
    return EpochRow(
        epoch=position.epoch + 1,
        loss=position.loss_sum / position.units if position.units else math.nan,
        figures=figures,
        seconds=seconds,
        measure_seconds=measure_seconds or None,
        samples_per_second=position.timed_samples / max(position.train_seconds, 1e-9),
        batch_size=sizes.batch_size,
        subdivisions=sizes.subdivisions,
        replicas=sizes.replicas,
        sub_batch_size=sizes.sub_batch_size,
        optimizer_steps=optimizer_steps,
        skipped_batches=position.skipped_batches,
        loss_scale_skips=position.loss_scale_skips if loss_scaled else None,
        learning_rate=learning_rate,
        peak_rss_mib=rss,
        peak_device_mib=device,
    )


class EpochLog(Hook):
    """Each row appended to ``metrics.jsonl`` (flushed; forced to disk by :meth:`sync`) and printed as one line,
    then its epoch's notes; the reason an early stop gives, last."""

    def __init__(self, run_dir: Path, *, epochs: int, metric_names: list[str], echo: Callable[[str], None]) -> None:
        self._run_dir = run_dir
        self._epochs = epochs
        self._metric_names = metric_names
        self._echo = echo

    def on_epoch_end(self, end: EpochEnd) -> None:
        append_metrics(self._run_dir, end.row)
        self._echo(epoch_line(end.row, self._epochs, self._metric_names))
        for note in end.notes:
            self._echo(note)

    def on_stop(self, stopped: str | None) -> None:
        if stopped is not None:
            self._echo(stopped)

    def sync(self) -> None:
        """Force the rows logged so far to disk (before a checkpoint, which a resume trusts them up to)."""
        sync_metrics(self._run_dir)


def peak_memory_mib() -> tuple[float, float | None]:
    """The process's peak resident memory and, on a GPU, the device's peak allocation (else None), in MiB."""
    # Linux reports ru_maxrss in KiB.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if not tf.config.list_logical_devices("GPU"):
        return rss, None
    return rss, tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
