"""Hooks: what the :class:`~accumrun.training.loop.Trainer` calls at named points of a run, modelled on Keras
callbacks, each concern one object. The points, in the order a run meets them (see :class:`Hook`):
``on_run_start``; before each call ``end_call_at``; after it ``on_batch_end`` (a call that crosses an epoch's end
is told in parts, each before its epoch's end, so an epoch's row counts its own updates), at an epoch's end
``epoch_figures`` and ``on_epoch_end``; ``on_call_end`` and, once every worker agreed, ``on_agreed``; ``on_stop``.
Hooks run in the order given; a later one sees what an earlier one did (as Keras callbacks see ``logs``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from accumrun.core.updates import Updates
from accumrun.rundir.metrics import EpochRow
from accumrun.training.checkpoints import Position


@dataclass(frozen=True, kw_only=True)
class BatchEnd:
    """The updates a call ran within one epoch (one row each), counted into ``position``."""

    updates: Updates
    first_batch: int
    """The batches of the epoch done before these."""
    position: Position
    """Where the run stands after them (the epoch's running totals)."""

    @property
    def count(self) -> int:
        """How many updates these are."""
        return len(self.updates.applied)

    def batch(self, k: int) -> int:
        """The 1-based number, in its epoch, of the batch of update ``k``."""
        return self.first_batch + k + 1


@dataclass(kw_only=True)
class EpochEnd:
    """An epoch's end: its row (which :meth:`stop` marks as the run's last), and notes to print after its line."""

    row: EpochRow
    notes: list[str] = field(default_factory=list)

    def stop(self, reason: str) -> None:
        """End the run after this epoch, for ``reason``."""
        self.row = dataclasses.replace(self.row, stopped=reason)


@dataclass(kw_only=True)
class CallEnd:
    """The end of a call: where the run stands, whether it ends here, and what the hooks ask for."""

    position: Position
    updates: Updates
    ended: bool
    """The run has trained its last epoch, or an epoch's end stopped it."""
    signal_number: int | None = None
    """A stop asked for (by a signal); in :meth:`Hook.on_agreed`, the one every worker agreed on (as ``checkpoint``)."""
    checkpoint: bool = False
    """A checkpoint asked for now."""
    saved: Path | None = None
    """The checkpoint :meth:`Hook.on_agreed` saved, if one did."""

    @property
    def host_work(self) -> bool:
        """Whether the call ends where a checkpoint is taken: one is due, a stop was asked for, or the run ends."""
        return self.checkpoint or self.signal_number is not None or self.ended


class Hook:
    """Does nothing at every point; a hook overrides the points it works at."""

    def on_run_start(self, position: Position) -> None:
        """The run starts (or resumes) at ``position``."""

    def end_call_at(self, position: Position, optimizer_steps: int) -> int | None:
        """The optimizer update count the call from ``position`` (after ``optimizer_steps``) must end at, at the
        latest, or None."""
        return None

    def on_batch_end(self, batches: BatchEnd) -> None:
        """The updates of a call (or of its part within one epoch) were counted."""

    measures: bool = False
    """Its ``epoch_figures`` measure between updates: their time is the row's measuring time, kept apart from
    training's."""

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        """Columns to add to the row of the epoch that ``position`` has just finished; ``ends_call`` says whether
        that epoch ended its call: only then may the host work (validate, decide) on its weights."""
        return {}

    def on_epoch_end(self, end: EpochEnd) -> None:
        """The epoch's row is built."""

    def on_call_end(self, call: CallEnd) -> None:
        """The call ended; ask for a checkpoint or a stop by setting them on ``call``."""

    def on_agreed(self, call: CallEnd) -> None:
        """Every worker agreed on ``call``'s checkpoint and stop; act on them."""

    def on_stop(self, stopped: str | None) -> None:
        """The run ends; ``stopped`` says why it ended early, if an epoch's end stopped it."""


class Hooks(Hook):
    """Several hooks as one, each point called on each, in order."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self._hooks = list(hooks)
        self.measuring_seconds = 0.0
        """The time the measuring hooks took in the last :meth:`epoch_figures`."""

    def on_run_start(self, position: Position) -> None:
        for hook in self._hooks:
            hook.on_run_start(position)

    def end_call_at(self, position: Position, optimizer_steps: int) -> int | None:
        asked = [at for hook in self._hooks if (at := hook.end_call_at(position, optimizer_steps)) is not None]
        return min(asked, default=None)

    def on_batch_end(self, batches: BatchEnd) -> None:
        for hook in self._hooks:
            hook.on_batch_end(batches)

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        """Every hook's columns; the time the measuring hooks took is :attr:`measuring_seconds`."""
        figures: dict[str, float] = {}
        self.measuring_seconds = 0.0
        for hook in self._hooks:
            started = time.perf_counter()
            added = hook.epoch_figures(position, ends_call)
            if hook.measures and added:  # it measured this epoch
                self.measuring_seconds += time.perf_counter() - started
            figures.update(added)
        return figures

    def on_epoch_end(self, end: EpochEnd) -> None:
        for hook in self._hooks:
            hook.on_epoch_end(end)

    def on_call_end(self, call: CallEnd) -> None:
        for hook in self._hooks:
            hook.on_call_end(call)

    def on_agreed(self, call: CallEnd) -> None:
        for hook in self._hooks:
            hook.on_agreed(call)

    def on_stop(self, stopped: str | None) -> None:
        """Every hook's, even after one of them fails (the first failure is raised after the others ran)."""
        failure: BaseException | None = None
        for hook in self._hooks:
            try:
                hook.on_stop(stopped)
            except BaseException as error:  # noqa: BLE001 - re-raised below, once every hook has stopped
                failure = failure or error
        if failure is not None:
            raise failure


def updates_slice(updates: Updates, start: int, stop: int) -> Updates:
    """The updates ``start`` to ``stop`` (excluded) of ``updates``."""
    return Updates(*(np.asarray(column)[start:stop] for column in updates))
