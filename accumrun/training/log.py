"""What a run records per epoch: the metrics row, written to ``metrics.jsonl``, TensorBoard and the console."""

from __future__ import annotations

import math
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from accumrun.rundir.metrics import append_metrics
from accumrun.rundir.tensorboard import TensorBoardLog
from accumrun.training.checkpoints import Position
from accumrun.training.console import epoch_line


def epoch_row(
    position: Position, metrics: dict[str, float], validation: dict[str, float], seconds: float, **facts: Any
) -> dict[str, Any]:
    """The metrics row of the epoch that ``position`` has just finished: the epoch (1-based), the mean loss over
    its samples and the ``metrics``, the ``validation`` figures, its wall time and throughput, then ``facts``
    (sizes, the optimizer's state) as given, and the peak memory so far."""
    return {
        "epoch": position.epoch + 1,
        "loss": position.loss_sum / position.samples if position.samples else math.nan,
        **metrics,
        **validation,
        "seconds": seconds,
        "samples_per_second": position.samples / max(position.train_seconds, 1e-9),
        **facts,
        **peak_memory_mib(),
    }


class RunLog:
    """The record of a run's epochs: each row goes to ``metrics.jsonl`` (flushed), TensorBoard and the console."""

    def __init__(
        self,
        run_dir: Path,
        *,
        epochs: int,
        rows: list[dict[str, Any]],
        tensorboard: TensorBoardLog,
        metric_names: list[str],
        echo: Callable[[str], None],
    ) -> None:
        self.rows = rows
        """Every epoch's row so far, the ones a resumed run kept included."""
        self._run_dir = run_dir
        self._epochs = epochs
        self._tensorboard = tensorboard
        self._metric_names = metric_names
        self._echo = echo

    def epoch(self, row: dict[str, Any]) -> None:
        """Record one epoch's row."""
        self.rows.append(row)
        self._tensorboard.epoch(row)
        append_metrics(self._run_dir, row)
        self._echo(epoch_line(row, self._epochs, self._metric_names))

    def update(self, batch_mean_loss: float) -> None:
        """Record one applied update's mean loss, when per-update logging is on."""
        self._tensorboard.update(batch_mean_loss)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        self._tensorboard.close()


def peak_memory_mib() -> dict[str, float]:
    """The process's peak resident memory and, on a GPU, the device's peak allocation, in MiB, so far."""
    # Linux reports ru_maxrss in KiB.
    peaks = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if tf.config.list_logical_devices("GPU"):
        peaks["peak_device_mib"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return peaks
