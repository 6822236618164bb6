"""The Trainer's hook seam, on scripted batches (no model): a hook adds a column to the epoch's row, ends a call at
a given update, and is told how many updates each call ran, in parts that end where the epochs end."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from accumrun.core.updates import Updates
from accumrun.training.batches import Batches
from accumrun.training.cadence import Cadence
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import BatchEnd, EpochEnd, Hook, Hooks
from accumrun.training.log import RowSizes
from accumrun.training.loop import Trainer

BATCHES_PER_EPOCH = 4


@dataclass
class _Iterations:
    count: int = 0

    def numpy(self) -> int:
        return self.count


@dataclass
class _Optimizer:
    """What the Trainer reads of an optimizer: its update count."""

    iterations: _Iterations = field(default_factory=_Iterations)


class _ScriptedBatches(Batches):
    """Batches of 2 samples, each update's loss 1 per sample; every call's size is recorded."""

    def __init__(self, optimizer: _Optimizer) -> None:
        super().__init__([[2]] * BATCHES_PER_EPOCH)
        self.optimizer = optimizer
        self.calls: list[int] = []

    def most_per_call(self, batch: int) -> int:
        return 1_000

    def run(self, epoch: int, batch: int, count: int) -> Updates:
        self.calls.append(count)
        first = self.optimizer.iterations.count
        self.optimizer.iterations.count += count
        return Updates(
            loss_sums=np.full(count, 2.0, np.float32),
            units=np.full(count, 2.0, np.float32),
            applied=np.ones(count, bool),
            learning_rates=np.full(count, 0.1, np.float32),
            optimizer_steps=np.arange(first + 1, first + count + 1, dtype=np.int64),
            metrics=np.zeros((count, 0), np.float32),
            measures=np.zeros((count, 0), np.float32),
        )


def _fit(hook: Hook, *, epochs: int = 2, updates_per_call: int = 3) -> tuple[Trainer, _ScriptedBatches]:
    optimizer = _Optimizer()
    batches = _ScriptedBatches(optimizer)
    trainer = Trainer(
        batches=batches,
        sizes=RowSizes(2, 1, 1, 2),
        optimizer=optimizer,  # type: ignore[arg-type]
        metric_names=[],
        cadence=Cadence(
            epochs=epochs,
            batches_per_epoch=BATCHES_PER_EPOCH,
            validate_every=1,
            validates=False,
            every_epoch_end=False,
            checkpoint_seconds=None,
            checkpoint_every_updates=None,
            updates_per_call=updates_per_call,
        ),
        hooks=Hooks([hook]),
        agree=lambda local: local,
    )
    trainer.fit(Position())
    return trainer, batches


class _Column(Hook):
    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        return {"measured": float(position.epoch + 10)}


def test_a_hook_adds_a_column_to_every_epoch_row() -> None:
    trainer, _ = _fit(_Column())
    assert [row.to_json()["measured"] for row in trainer.rows] == [10.0, 11.0]
    assert [row.optimizer_steps for row in trainer.rows] == [4, 8]


class _EndAt(Hook):
    """Ends the call that would run past update 5."""

    def end_call_at(self, position: Position, optimizer_steps: int) -> int | None:
        return 5 if optimizer_steps < 5 else None


def test_a_hook_ends_a_call_at_the_update_it_asks_for() -> None:
    trainer, batches = _fit(_EndAt())
    # 3 a call, but the second ends at update 5; the last call runs what is left of the run.
    assert batches.calls == [3, 2, 3]
    assert len(trainer.rows) == 2 and trainer.rows[-1].optimizer_steps == 8


@dataclass
class _Counts(Hook):
    told: list[tuple[int, int, int]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def on_batch_end(self, batches: BatchEnd) -> None:
        self.told.append((batches.position.epoch, batches.first_batch, batches.count))

    def on_epoch_end(self, end: EpochEnd) -> None:
        self.ends.append(end.row.epoch)


def test_a_hook_is_told_each_calls_updates_in_parts_that_end_with_their_epoch() -> None:
    counts = _Counts()
    _, batches = _fit(counts)
    assert batches.calls == [3, 3, 2]
    # (epoch, batches before, updates): the second call crosses the first epoch's end.
    assert counts.told == [(0, 0, 3), (0, 3, 1), (1, 0, 2), (1, 2, 2)]
    assert counts.ends == [1, 2]


class _StopAfterFirstEpoch(Hook):
    def on_epoch_end(self, end: EpochEnd) -> None:
        end.stop("scripted stop")


def test_a_hook_stops_the_run_after_an_epoch() -> None:
    trainer, _ = _fit(_StopAfterFirstEpoch(), updates_per_call=4)
    assert [row.stopped for row in trainer.rows] == ["scripted stop"]
