"""The checkpoint hook. A checkpoint is due at the end of an epoch (``checkpoint_every: null``),
``checkpoint_every`` since the last, or after an update count that ``checkpoint_every_updates`` divides (the
cadence ends a call there); one is taken too at a stop, a signal and the run's end. The rows logged so far are
forced to disk first: a resume trusts them up to the checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable

from accumrun.training.checkpoints import CheckpointStore, Position
from accumrun.training.hooks import CallEnd, Hook


class Checkpointing(Hook):
    """Asks for a checkpoint when one is due; saves it (after ``sync``) once every worker agreed, at a stop or end."""

    def __init__(
        self, store: CheckpointStore, *, seconds: float | None, every_updates: int | None, sync: Callable[[], None]
    ) -> None:
        self._store = store
        self._seconds = seconds
        self._every_updates = every_updates
        self._sync = sync
        self._last = time.monotonic()

    def on_run_start(self, position: Position) -> None:
        self._last = time.monotonic()

    def on_call_end(self, call: CallEnd) -> None:
        call.checkpoint = call.checkpoint or self._due(call)

    def on_agreed(self, call: CallEnd) -> None:
        if call.host_work:
            self._sync()
            self._last = time.monotonic()
            call.saved = self._store.save(call.position)

    def _due(self, call: CallEnd) -> bool:
        """Whether ``call`` ends where a checkpoint is due."""
        if self._seconds is None:
            if call.position.batch == 0:
                return True
        elif time.monotonic() - self._last >= self._seconds:
            return True
        every, updates = self._every_updates, call.updates
        return bool(every and updates.applied[-1] and int(updates.optimizer_steps[-1]) % every == 0)
