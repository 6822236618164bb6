"""The run directory's files, each written so that a run killed at any instant leaves nothing misleading.

``run.json`` and ``model.keras`` are written under a temporary name and renamed; ``metrics.jsonl`` gets one
fsync'd line per epoch. A directory is reused only to resume its run, or when the user says ``--overwrite``.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from accumrun import __version__
from accumrun.errors import ConfigError

# Everything a run writes; --overwrite removes these and nothing else.
RUN_FILES = ("run.json", "config.yaml", "metrics.jsonl", "model.keras", "checkpoints", "tensorboard")


# Rewritten by every session of a run; the other keys of run.json (such as the auto choice) carry over.
_PER_SESSION_KEYS = ("status", "reason", "started", "ended", "resumed", "accumrun_version", "tensorflow_version")


class RunStatus:
    """``run.json``: whether the run is running, completed, interrupted or failed (and why), with its times
    and versions. Rewritten atomically, so it is always a complete JSON document."""

    def __init__(self, path: Path, resumed: bool = False, details: dict[str, Any] | None = None) -> None:
        self._path = path
        now = datetime.now().isoformat(timespec="seconds")
        previous = json.loads(path.read_text()) if resumed and path.is_file() else {}
        self._record: dict[str, Any] = {
            "status": "running",
            "reason": None,
            "started": previous.get("started", now),
            "ended": None,
            "resumed": previous.get("resumed", []) + ([now] if resumed else []),
            "accumrun_version": __version__,
            "tensorflow_version": tf.__version__,
            **{key: value for key, value in previous.items() if key not in _PER_SESSION_KEYS},
            **(details or {}),
        }
        self._write()

    def end(self, status: str, reason: str | None = None) -> None:
        """Record how the run ended: ``completed``, ``interrupted`` or ``failed``, with the reason."""
        self._record.update(status=status, reason=reason, ended=datetime.now().isoformat(timespec="seconds"))
        self._write()

    def _write(self) -> None:
        partial = self._path.with_name(f".{self._path.name}.partial")
        partial.write_text(json.dumps(self._record, indent=2) + "\n")
        os.replace(partial, self._path)


def prepare_run_dir(run_dir: Path, overwrite: bool = False) -> None:
    """Create ``run_dir`` for a new run. An existing non-empty one is refused, or emptied with ``overwrite``.

    Raises:
        ConfigError: the folder holds a run (say how to resume or replace it) or files accumrun did not write.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("output.run_dir", "exists and is not a folder", str(run_dir))
    existing = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    if existing and not overwrite:
        raise ConfigError("output.run_dir", _why_taken(run_dir), str(run_dir))
    foreign = [name for name in existing if name not in RUN_FILES and not name.startswith(".")]
    if foreign:
        raise ConfigError(
            "output.run_dir", f"holds files accumrun did not write ({', '.join(foreign)}); not overwriting it"
        )
    for name in existing:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


def _why_taken(run_dir: Path) -> str:
    status = read_status(run_dir)
    if status == "completed":
        return "holds a completed run; pass --overwrite to replace it, or choose another --run-dir"
    if status is not None:
        return f"holds a {status} run; continue it with --resume {run_dir}, or pass --overwrite to replace it"
    return "exists and is not empty; choose another --run-dir"


def read_status(run_dir: Path) -> str | None:
    """The status recorded in ``run_dir/run.json``, or None when there is no readable one."""
    try:
        return json.loads((run_dir / "run.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def append_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one epoch's row to ``metrics.jsonl`` and force it to disk."""
    with (run_dir / "metrics.jsonl").open("a") as file:
        file.write(json.dumps(row) + "\n")
        file.flush()
        os.fsync(file.fileno())


def keep_metrics_before(run_dir: Path, epochs: int) -> list[dict[str, Any]]:
    """Keep only the rows of the first ``epochs`` epochs (a resumed run logs the later ones again); return them."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    rows = [json.loads(line) for line in lines if line.strip()]
    kept = [row for row in rows if row["epoch"] <= epochs]
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(json.dumps(row) + "\n" for row in kept))
    os.replace(partial, path)
    return kept


def save_model_atomically(model: keras.Model, path: Path) -> None:
    """Save ``model`` to ``path`` (a ``.keras`` file) via a temporary file and a rename."""
    # Keras insists on the .keras suffix for the temporary name too.
    partial = path.with_name(f".{path.stem}.partial.keras")
    model.save(partial)
    os.replace(partial, path)
