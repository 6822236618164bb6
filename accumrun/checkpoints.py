"""Checkpoints at batch boundaries: the model, the optimizer and where in the data order the run stands.

A checkpoint is one ``.npz`` file holding every model variable (weights, BatchNorm statistics, dropout seed
state), every optimizer variable (its iteration counter and moments) and a :class:`Position`. The data order
needs nothing more: it is a function of the seed and the epoch (:func:`accumrun.data.epoch_order`), so the
position says where to pick it up. Files are written under a temporary name and renamed, so a run killed at any
instant leaves only complete checkpoints.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import keras
import numpy as np

from accumrun.errors import ConfigError


@dataclass
class Position:
    """Where a run stands: ``batch`` batches done in epoch ``epoch`` (0-based), and that epoch's sums so far."""

    epoch: int = 0
    batch: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    samples: int = 0
    skipped_batches: int = 0
    loss_scale_skips: int = 0
    train_seconds: float = 0.0

    @property
    def name(self) -> str:
        """The checkpoint's file stem; sorting the stems sorts the positions."""
        return f"ckpt-epoch{self.epoch:05d}-batch{self.batch:07d}"


class CheckpointStore:
    """The ``checkpoints/`` folder of a run, keeping the newest ``keep`` checkpoints."""

    def __init__(self, folder: Path, keep: int) -> None:
        self.folder = folder
        self._keep = keep

    def save(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, position: Position) -> Path:
        """Write a checkpoint of the current state at ``position``, then drop the oldest beyond ``keep``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        arrays = {f"model/{i}": np.asarray(v.numpy()) for i, v in enumerate(model.variables)}
        arrays.update({f"optimizer/{i}": np.asarray(v.numpy()) for i, v in enumerate(optimizer.variables)})
        arrays["position"] = np.array(json.dumps(asdict(position)))
        path = self.folder / f"{position.name}.npz"
        partial = self.folder / f".{position.name}.partial.npz"
        with partial.open("wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
        for old in self.checkpoints()[: -self._keep]:
            old.unlink()
        return path

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints, oldest first."""
        return sorted(self.folder.glob("ckpt-*.npz")) if self.folder.is_dir() else []

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    @staticmethod
    def load(path: Path, model: keras.Model, optimizer: keras.optimizers.Optimizer) -> Position:
        """Restore the model and the (built) optimizer from ``path``; return the position it was taken at.

        Raises:
            ConfigError: the checkpoint is unreadable or was made for another model or optimizer.
        """
        try:
            with np.load(path) as stored:
                arrays = {key: stored[key] for key in stored.files}
        except (OSError, ValueError) as error:
            raise ConfigError("--resume", f"cannot read checkpoint {path.name}: {error}") from None
        for prefix, variables in (("model", model.variables), ("optimizer", optimizer.variables)):
            values = [arrays.get(f"{prefix}/{i}") for i in range(len(variables))]
            extra = f"{prefix}/{len(variables)}" in arrays
            if extra or any(v is None or v.shape != tuple(var.shape) for v, var in zip(values, variables, strict=True)):
                raise ConfigError("--resume", f"checkpoint {path.name} does not match the configured {prefix}")
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)
        return Position(**json.loads(str(arrays["position"])))
