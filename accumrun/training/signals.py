"""Graceful stops: SIGINT or SIGTERM asks the run to stop at the next batch boundary. A compiled call cannot be cut
in half, and a checkpoint taken mid-accumulation would be wrong, so the signal only raises a flag
(:class:`~accumrun.stops.StopRequests`), checked after every call; a second Ctrl-C raises ``KeyboardInterrupt`` at
once.
"""

from __future__ import annotations

import signal

from accumrun.errors import Interrupted
from accumrun.stops import StopRequests, resume_command
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import CallEnd, Hook

__all__ = ["Signals", "StopRequests", "resume_command"]


class Signals(Hook):
    """SIGINT and SIGTERM ask for a stop at the call's end; after its checkpoint, :class:`Interrupted` says so."""

    def __init__(self, batches_per_epoch: int, resume_command: str) -> None:
        self._batches_per_epoch = batches_per_epoch
        self._resume_command = resume_command
        self._requests = StopRequests()

    def on_run_start(self, position: Position) -> None:
        self._requests.__enter__()

    def on_call_end(self, call: CallEnd) -> None:
        call.signal_number = self._requests.signal_number

    def on_agreed(self, call: CallEnd) -> None:
        """Raise :class:`Interrupted` after the checkpoint when a stop was asked for; a run that has just ended
        completes (its model saved) rather than stop: there is nothing left to resume."""
        if call.signal_number is None or call.ended:
            return
        name = signal.Signals(call.signal_number).name
        epoch, batch = call.position.counted(self._batches_per_epoch)
        reason = f"{name} at epoch {epoch}, batch {batch}; saved {call.saved}"
        raise Interrupted(call.signal_number, reason, self._resume_command)

    def on_stop(self, stopped: str | None) -> None:
        self._requests.__exit__(None, None, None)
