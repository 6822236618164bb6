"""Graceful stops: SIGINT or SIGTERM asks the run to stop at the next batch boundary. A compiled call cannot be cut
in half, and a checkpoint taken mid-accumulation would be wrong, so the signal only raises a flag, checked after
every call; a second Ctrl-C raises ``KeyboardInterrupt`` at once.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from accumrun.errors import Interrupted
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import CallEnd, Hook


class StopRequests:
    """A context manager that turns SIGINT and SIGTERM into :attr:`signal_number` while it is active."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signal_number: int | None = None
        self._child_stops = False
        # The handlers to put back on exit, as signal.signal returns them.
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None] = {}

    def __enter__(self) -> StopRequests:
        # Python runs signal handlers in the main thread only; elsewhere (a test's thread) the defaults stay.
        if threading.current_thread() is threading.main_thread():
            for number in self._SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    @contextlib.contextmanager
    def child_stops(self) -> Iterator[None]:
        """While a child process runs that Ctrl-C reaches too (it is in the terminal's process group): a second
        Ctrl-C stops the child at once, and is not a KeyboardInterrupt here, which would abandon it mid-write."""
        self._child_stops = True
        try:
            yield
        finally:
            self._child_stops = False

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.signal_number is not None and number == signal.SIGINT:
            if self._child_stops:
                return
            raise KeyboardInterrupt
        self.signal_number = number
        name = signal.Signals(number).name
        print(
            f"\n{name}: stopping after the updates under way (Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )


def resume_command(run_dir: Path, command: str = "train") -> str:
    """The command that resumes the run (or with ``command="compare"`` the comparison) in ``run_dir``, runnable as
    printed: this interpreter, by its full path, runs ``-m accumrun``, so it works outside an activated virtual
    environment too."""
    return shlex.join([sys.executable, "-m", "accumrun", command, "--resume", str(run_dir)])


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
