"""Checkpoints at batch boundaries: one ``.npz`` file of every model, optimizer and training-metric variable, and
the :class:`Position` (the data order is a function of the seed and the epoch). Files are written atomically, so a
run killed at any instant leaves only complete checkpoints. The newest is found by the position inside, not by the
name, so files named the old way (0-based epochs) still load.

A checkpoint is written and read one variable at a time, so the host holds one variable's copy beside the state,
not a second copy of all of it (with Adam, the weights and both slots: copied at once, they raised a 50M-parameter
GPT-2's peak by 484 MiB at sequence length 16).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import keras
import numpy as np

from accumrun.errors import ConfigError
from accumrun.rundir.atomic import write_atomically


@dataclass
class Position:
    """Where a run stands: ``batch`` batches done in epoch ``epoch`` (0-based; an epoch's end is the next one's
    start), and that epoch's sums (``units``: samples, or real tokens; hooks' measurements). A resumed process
    starts ``train_seconds`` and ``timed_samples`` again, so a resumed epoch reports its own speed, not one spread
    over two processes."""

    epoch: int = 0
    batch: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    units: float = 0.0
    skipped_batches: int = 0
    loss_scale_skips: int = 0
    train_seconds: float = 0.0
    timed_samples: int = 0
    measure_sums: dict[str, float] = field(default_factory=dict)
    """The epoch's running sums of what hooks measure (:mod:`accumrun.training.noise_scale`)."""
    carried_measures: dict[str, float] = field(default_factory=dict)
    """What hooks carry from epoch to epoch (exponential averages): the next epoch's position starts with it."""

    def counted(self, batches_per_epoch: int) -> tuple[int, int]:
        """``(epoch, batch)`` as the console counts: 1-based epoch, batches done (an epoch's end is its last batch)."""
        if self.batch == 0 and self.epoch > 0:
            return self.epoch, batches_per_epoch
        return self.epoch + 1, self.batch

    def checkpoint_name(self, batches_per_epoch: int) -> str:
        """The file stem, counted as the console counts: ``ckpt-epoch00002-batch0000005``."""
        epoch, batch = self.counted(batches_per_epoch)
        return f"ckpt-epoch{epoch:05d}-batch{batch:07d}"

    @property
    def order(self) -> tuple[int, int]:
        """A key that sorts positions in training order."""
        return self.epoch, self.batch

    @classmethod
    def stored(cls, text: str) -> Position:
        """The position a checkpoint holds, its timing started again (keys this version does not know dropped)."""
        known = {field.name for field in fields(cls)} - {"train_seconds", "timed_samples"}
        stored = {key: value for key, value in json.loads(text).items() if key in known}
        # Checkpoints from before token-level losses counted samples, one unit each.
        stored.setdefault("units", float(stored.get("samples", 0)))
        return cls(**stored)


State = dict[str, list[Any]]
"""The variables a checkpoint holds, by group: ``model``, ``optimizer``, ``metrics``."""
# Groups that a checkpoint of an earlier version may lack; they then keep their fresh values.
_OPTIONAL_GROUPS = ("metrics",)


class CheckpointStore:
    """The ``checkpoints/`` folder of a run, holding ``state`` at batch boundaries; the newest ``keep`` stay."""

    def __init__(self, folder: Path, keep: int, batches_per_epoch: int = 0, state: State | None = None) -> None:
        self.folder = folder
        self._keep = keep
        self._batches_per_epoch = batches_per_epoch
        self._state = state or {}
        # Each file's stored position, read once: rotation after every save reads no file it has seen.
        self._orders: dict[Path, tuple[int, int]] = {}

    def save(self, position: Position) -> Path:
        """Write a checkpoint of the current state at ``position``, then drop the oldest beyond ``keep``."""
        path = self.folder / f"{position.checkpoint_name(self._batches_per_epoch)}.npz"
        write_atomically(path, lambda temporary: self._write(temporary, position))
        self._orders[path] = position.order
        for old in self.checkpoints()[: -self._keep]:
            old.unlink()
            self._orders.pop(old, None)
        return path

    def _write(self, temporary: Path, position: Position) -> None:
        """The state and ``position`` as ``np.savez`` writes them (``KEY.npy`` members of an uncompressed zip), each
        variable copied to the host as its turn comes."""
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for group, variables in self._state.items():
                for i, variable in enumerate(variables):
                    _write_member(archive, f"{group}/{i}", np.asarray(keras.ops.convert_to_numpy(variable)))
            _write_member(archive, "position", np.array(json.dumps(asdict(position))))

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints, oldest first (by the position stored in each)."""
        if not self.folder.is_dir():
            return []
        found = list(self.folder.glob("ckpt-*.npz"))
        for path in found:
            if path not in self._orders:
                self._orders[path] = _stored_position(path).order
        return sorted(found, key=lambda path: (self._orders[path], path.name))

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        return next(reversed(self.checkpoints()), None)

    def load(self, path: Path) -> Position:
        """Restore the state from ``path`` (the optimizer built); return the position it was taken at. ConfigError:
        the checkpoint is unreadable or was made for another model, optimizer or metrics.

        The position and every variable's shape are read before any variable changes. A file damaged inside a
        variable's data is found as that variable is read, after the ones before it: the run stops there (nothing
        goes on from a half-restored state)."""
        try:
            # Opened here, so that the file is closed even where numpy fails to read it as an archive.
            with path.open("rb") as file, np.load(file) as stored:
                shapes = {key: _stored_shape(stored, key) for key in stored.files}
                restored = [group for group in self._state if self._holds(group, shapes, path)]
                position = Position.stored(str(stored["position"]))
                for group in restored:
                    for i, variable in enumerate(self._state[group]):
                        variable.assign(stored[f"{group}/{i}"])  # one array on the host at a time
                return position
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise ConfigError("resume", f"cannot read checkpoint {path.name}: {error}") from None

    def _holds(self, group: str, shapes: dict[str, tuple[int, ...]], path: Path) -> bool:
        """Whether the checkpoint holds ``group`` (an optional group may be missing): ConfigError where it holds
        other variables than the configured ones."""
        variables = self._state[group]
        if group in _OPTIONAL_GROUPS and not any(key.startswith(f"{group}/") for key in shapes):
            return False
        stored = [shapes.get(f"{group}/{i}") for i in range(len(variables))]
        if f"{group}/{len(variables)}" in shapes or stored != [tuple(v.shape) for v in variables]:
            raise ConfigError("resume", f"checkpoint {path.name} does not match the configured {group}")
        return True


def _write_member(archive: zipfile.ZipFile, key: str, array: np.ndarray) -> None:
    """``array`` as the member ``KEY.npy``, as ``np.savez`` writes it (so ``np.load`` reads it)."""
    with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, array, allow_pickle=False)


def _stored_shape(stored: Any, key: str) -> tuple[int, ...]:
    """The shape of the array ``key`` of an open ``.npz``, from its header alone (its data is not read)."""
    with stored.zip.open(f"{key}.npy") as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, _ = np.lib.format.read_array_header_1_0(member)
        else:  # 2.0, or 3.0 (the same header in UTF-8, which numpy writes only for non-Latin-1 field names)
            shape, _, _ = np.lib.format.read_array_header_2_0(member)
        return tuple(shape)


def _stored_position(path: Path) -> Position:
    """The position inside a checkpoint; an unreadable file sorts first, so it is never taken as the newest."""
    try:
        with path.open("rb") as file, np.load(file) as stored:
            # An .npz is a zip: this reads the one small member, not the weights.
            return Position.stored(str(stored["position"]))
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return Position(epoch=-1)
