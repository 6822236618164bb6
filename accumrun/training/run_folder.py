"""The Run: a run's folder as training uses it. A new run claims the folder, a resumed one reopens it at its
latest checkpoint; the run writes its files, keeps its checkpoints, and records in ``run.json`` how each session
ended. It knows nothing of the model but the variables it checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from accumrun.config.schema import Config
from accumrun.data.dataset import Dataset
from accumrun.data.vocabulary import save_learned
from accumrun.errors import ConfigError
from accumrun.rundir.atomic import sweep_leftovers, write_text_atomically
from accumrun.rundir.layout import prepare_run_dir, write_features, write_labels
from accumrun.rundir.metrics import EpochRow, keep_metrics, metrics_before
from accumrun.rundir.status import AutoNote, BatchNormNote, RunStatus
from accumrun.training.checkpoints import CheckpointStore, Position, State


@dataclass(frozen=True)
class Run:
    """Where a run writes, where it lives, and its checkpoints."""

    folder: Path
    """Where this process writes: ``home``, or on a multi-worker run's other workers a scratch folder."""
    home: Path
    """The run's directory, which a resume names."""
    store: CheckpointStore
    """The checkpoints this process writes."""
    home_store: CheckpointStore
    """The run's own checkpoints, which a resume restores."""

    @classmethod
    def open(cls, folder: Path, *, home: Path, keep: int, batches_per_epoch: int, state: State) -> Run:
        """The run writing into ``folder``, whose directory is ``home``, checkpointing ``state``."""
        store = CheckpointStore(folder / "checkpoints", keep, batches_per_epoch, state)
        home_store = store if home == folder else CheckpointStore(home / "checkpoints", keep, batches_per_epoch, state)
        return cls(folder, home, store, home_store)

    def start(self, *, overwrite: bool = False) -> tuple[Position, list[EpochRow]]:
        """Claim the folder for a new run (see :func:`accumrun.rundir.layout.prepare_run_dir`), at its start."""
        prepare_run_dir(self.folder, overwrite)
        return Position(), []

    def resume(self, epochs: int) -> tuple[Position, list[EpochRow]]:
        """Restore the run's latest checkpoint; return its position and the rows logged up to it (the later ones
        are dropped: they will be logged again), and sweep away the files that a killed process left half-written.
        ConfigError: no checkpoint, or nothing left to train."""
        if self.home == self.folder:
            # What the stopped process was writing when it was killed: a model on disk twice, a checkpoint. Before
            # any refusal, so that a finished run's folder is swept too.
            for folder in (self.folder, self.store.folder):
                sweep_leftovers(folder)
        checkpoint = self.home_store.latest()
        if checkpoint is None:
            raise ConfigError(
                "resume", "holds no checkpoint to resume from; train it again with --overwrite", str(self.home)
            )
        position = self.home_store.load(checkpoint)
        rows = metrics_before(self.home, position.epoch)
        stopped = next((row.stopped for row in rows if row.stopped is not None), None)
        if stopped is not None:
            raise ConfigError("resume", f"the run ended by {stopped}; start a new run to train further", str(self.home))
        if position.epoch >= epochs:
            noun = "epoch" if epochs == 1 else "epochs"
            raise ConfigError(
                "resume",
                f"the run has finished its {epochs} {noun}; pass --epochs N (more than {epochs}) to train further",
                str(self.home),
            )
        if self.home == self.folder:
            keep_metrics(self.folder, rows)
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
        return position, rows

    def write_files(self, config: Config, dataset: Dataset) -> None:
        """``config.yaml`` (resolved), and where there are any, the labels, features and what the tokenizer learned."""
        write_text_atomically(self.folder / "config.yaml", config.to_yaml())
        save_learned(self.folder, config.data)
        if dataset.labels is not None:
            write_labels(self.folder, dataset.labels)
        if dataset.features is not None:
            write_features(self.folder, dataset.features)

    def status(
        self, *, resumed: bool, batch_norm: BatchNormNote | None, subdivisions_auto: AutoNote | None
    ) -> RunStatus:
        """``run.json`` for this session, to enter around training (see :class:`RunStatus`)."""
        return RunStatus(
            self.folder,
            tensorflow_version=tf.__version__,
            resumed=resumed,
            batch_norm=batch_norm,
            subdivisions_auto=subdivisions_auto,
        )
