"""How a stop is asked for: SIGINT and SIGTERM turned into a flag that a run (or a comparison of runs) checks at its
boundaries, a second Ctrl-C at once; and the command that goes on from where it stopped. Nothing of accumrun is
imported here, so a run's hooks and a comparison's loop share it.
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
        again = " again" if number == signal.SIGINT else ""  # after a SIGTERM, a first Ctrl-C stops at once
        print(
            f"\n{name}: stopping after the updates under way (Ctrl-C{again} to stop at once)",
            file=sys.stderr,
            flush=True,
        )


def resume_command(run_dir: Path, command: str = "train") -> str:
    """The command that resumes the run (or with ``command="compare"`` the comparison) in ``run_dir``, runnable as
    printed: this interpreter, by its full path, runs ``-m accumrun``, so it works outside an activated virtual
    environment too."""
    return shlex.join([sys.executable, "-m", "accumrun", command, "--resume", str(run_dir)])
