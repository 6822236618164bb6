"""``metrics.jsonl``: one JSON object per epoch, appended and forced to disk as each epoch ends."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accumrun.errors import DataError
from accumrun.rundir.atomic import write_text_atomically

METRICS_FILE = "metrics.jsonl"


def append_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one epoch's row to ``metrics.jsonl`` and force it to disk."""
    with (run_dir / METRICS_FILE).open("a") as file:
        file.write(json.dumps(row) + "\n")
        file.flush()
        os.fsync(file.fileno())


def metrics_before(run_dir: Path, epochs: int) -> list[dict[str, Any]]:
    """The rows of the first ``epochs`` epochs (those a resumed run keeps; it logs the later ones again)."""
    path = run_dir / METRICS_FILE
    rows = load_metrics(run_dir) if path.is_file() and path.read_text().strip() else []
    return [row for row in rows if row["epoch"] <= epochs]


def keep_metrics(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``metrics.jsonl`` with ``rows`` only, atomically."""
    write_text_atomically(run_dir / METRICS_FILE, "".join(json.dumps(row) + "\n" for row in rows))


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Read the per-epoch rows that a run wrote to ``run_dir/metrics.jsonl``, in file order.

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
