"""``metrics.jsonl``: one JSON object per epoch, appended and forced to disk as each epoch ends.

:class:`EpochRow` is one line as a type: :meth:`EpochRow.to_json` is its one writer, :meth:`EpochRow.from_json`
its one reader. The Python API hands rows out as the writer's plain dicts (``result.metrics[-1]["val_loss"]``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accumrun.errors import DataError
from accumrun.rundir.atomic import write_text_atomically

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True, kw_only=True)
class EpochRow:
    """One epoch of a run: its mean loss, its figures, its time, the sizes it trained with and the optimizer's
    state after it."""

    epoch: int
    """1-based."""
    loss: float
    """The mean loss over the epoch's samples."""
    figures: dict[str, float] = field(default_factory=dict)
    """Each metric under its logged name, then ``val_loss`` and ``val_<metric>`` when there is validation data."""
    seconds: float = math.nan
    """The epoch's wall time: training, validation and any measuring."""
    measure_seconds: float | None = None
    """The part of :attr:`seconds` spent measuring between updates (on the epochs a periodic measurement ran)."""
    samples_per_second: float = math.nan
    """Training's alone."""
    batch_size: int = 0
    subdivisions: int = 0
    replicas: int = 1
    sub_batch_size: int = 0
    optimizer_steps: int = 0
    skipped_batches: int = 0
    loss_scale_skips: int | None = None
    """Updates the float16 loss scale skipped (mixed_float16 only)."""
    learning_rate: float = 0.0
    peak_rss_mib: float = math.nan
    peak_device_mib: float | None = None
    """On a GPU only."""
    stopped: str | None = None
    """Why training stopped after this epoch, before its last one."""

    def figure(self, name: str) -> float:
        """A logged figure by name: ``loss``, a metric, or its ``val_`` twin.

        Raises:
            KeyError: the row does not log ``name``.
        """
        return self.loss if name == "loss" else self.figures[name]

    @property
    def logged(self) -> set[str]:
        """The figures the row holds: ``loss``, the metrics, and their ``val_`` twins after validation."""
        return {"loss", *self.figures}

    def to_json(self) -> dict[str, Any]:
        """The row as ``metrics.jsonl`` holds it: the epoch, the loss and the figures first, optional keys only
        when they apply."""
        optional = {
            "loss_scale_skips": self.loss_scale_skips,
            "peak_device_mib": self.peak_device_mib,
            "stopped": self.stopped,
            "measure_seconds": self.measure_seconds,
        }
        document = {
            "epoch": self.epoch,
            "loss": self.loss,
            **self.figures,
            "seconds": self.seconds,
            "measure_seconds": self.measure_seconds,
            "samples_per_second": self.samples_per_second,
            "batch_size": self.batch_size,
            "subdivisions": self.subdivisions,
            "replicas": self.replicas,
            "sub_batch_size": self.sub_batch_size,
            "optimizer_steps": self.optimizer_steps,
            "skipped_batches": self.skipped_batches,
            "loss_scale_skips": self.loss_scale_skips,
            "learning_rate": self.learning_rate,
            "peak_rss_mib": self.peak_rss_mib,
            "peak_device_mib": self.peak_device_mib,
            "stopped": self.stopped,
        }
        return {key: value for key, value in document.items() if key not in optional or value is not None}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> EpochRow:
        """The row from one parsed line; keys other than the fixed ones are figures. A key that a row of an
        earlier version lacks keeps its default."""
        fixed = {name for name in cls.__dataclass_fields__ if name != "figures"}
        return cls(
            **{key: value for key, value in document.items() if key in fixed},
            figures={key: value for key, value in document.items() if key not in fixed},
        )


def append_metrics(run_dir: Path, row: EpochRow) -> None:
    """Append one epoch's row to ``metrics.jsonl``, flushed to the operating system (a reader sees it at once;
    :func:`sync_metrics` forces it to disk)."""
    with (run_dir / METRICS_FILE).open("a") as file:
        file.write(json.dumps(row.to_json()) + "\n")


def sync_metrics(run_dir: Path) -> None:
    """Force ``metrics.jsonl`` to disk, if it exists."""
    path = run_dir / METRICS_FILE
    if path.is_file():
        with path.open("rb") as file:
            os.fsync(file.fileno())


def metrics_before(run_dir: Path, epochs: int) -> list[EpochRow]:
    """The rows of the first ``epochs`` epochs (those a resumed run keeps; it logs the later ones again).

    Rows past the last checkpoint were flushed, not forced to disk, so after a power loss the last line may be
    torn; it is past the checkpoint, and dropped like the rest of them.
    """
    path = run_dir / METRICS_FILE
    lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    rows = [EpochRow.from_json(json.loads(line)) for line in lines if line.strip()]
    return [row for row in rows if row.epoch <= epochs]


def keep_metrics(run_dir: Path, rows: list[EpochRow]) -> None:
    """Rewrite ``metrics.jsonl`` with ``rows`` only, atomically."""
    write_text_atomically(run_dir / METRICS_FILE, "".join(json.dumps(row.to_json()) + "\n" for row in rows))


def read_rows(run_dir: Path) -> list[EpochRow]:
    """The per-epoch rows that a run wrote to ``run_dir/metrics.jsonl``, in file order.

    Raises:
        DataError: The directory or file is missing, a line is not a JSON object, or there are no rows.
    """
    return [EpochRow.from_json(document) for document in load_metrics(run_dir)]


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of ``run_dir/metrics.jsonl`` as JSON objects, in file order (for plots; see :func:`read_rows`).

    Raises:
        DataError: The directory or file is missing, a line is not a JSON object, or there are no rows.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise DataError(str(path), "no metrics.jsonl; is this a run directory?")
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue  # a trailing blank line is harmless
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(str(path), f"line {number} is not JSON: {error.msg}", line.strip()[:80]) from None
            if not isinstance(row, dict):
                raise DataError(str(path), f"line {number} is not a JSON object", row)
            rows.append(row)
    if not rows:
        raise DataError(str(path), "has no rows; did the run finish an epoch?")
    return rows
