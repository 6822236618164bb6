"""The group every command joins, and the process around it: a bad argument is a usage error, an unexpected
exception one line, a closed stdout ends nothing; TensorFlow starts quietly, and its teardown is skipped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

import click

from accumrun._version import __version__
from accumrun.errors import ArgumentError

if TYPE_CHECKING:
    import tensorflow as tf

    from accumrun.config.schema import DistributeConfig


class Command(click.Command):
    """Shows a bad argument of the API call (:class:`~accumrun.errors.ArgumentError`) as a usage error."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ArgumentError as error:
            raise click.UsageError(error.message, ctx) from None


class _ClosedStdoutIgnored:
    """``sys.stdout`` for a command whose reader may go away (``accumrun train ... | head -4``): once the pipe is
    closed, the output goes to the null device and the command carries on, as its run folder is what counts."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._to_null_device()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_null_device()

    def _to_null_device(self) -> None:
        # Python's advice (the signal module's notes on SIGPIPE): this buffer and every later one go to os.devnull.
        self.reader_gone = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Group(click.Group):
    """Turns an unexpected exception into a one-line error instead of a traceback; a closed stdout ends nothing."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with contextlib.redirect_stdout(_ClosedStdoutIgnored(sys.stdout)):
                return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:
            if os.environ.get("ACCUMRUN_TRACEBACK"):
                traceback.print_exc()
            raise click.ClickException(_explain_unexpected(error)) from None


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_CALL_HEADER = re.compile(r"^Exception encountered when calling (.+)\.$")


def _explain_unexpected(error: Exception) -> str:
    """One line for an error accumrun did not foresee: its class, where it was raised if known, and its cause."""
    name = type(error).__name__
    if name == "ResourceExhaustedError":
        return "out of memory: raise training.subdivisions to shrink the sub-batch"
    lines = [line.strip() for line in _ANSI_ESCAPE.sub("", str(error)).splitlines() if line.strip()] or [""]
    if lines[0] == "in user code:":
        # Raised inside a tf.function: a stack, then the error again as "<class>: <message>" on lines of its own.
        starts = [i for i, line in enumerate(lines) if line.startswith(f"{name}: ")]
        lines = [lines[starts[-1]].removeprefix(f"{name}: "), *lines[starts[-1] + 1 :]] if starts else lines[-1:]
    where = ""
    # Keras wraps an error in a layer's call: "Exception encountered when calling X.call().", then the message.
    header = _KERAS_CALL_HEADER.match(lines[0])
    if header and len(lines) > 1:
        where, lines = f" in {header.group(1)}", lines[1:]
    return f"unexpected {name}{where}: {lines[0]} (set ACCUMRUN_TRACEBACK=1 to see where)"


def start_tensorflow(distribute: DistributeConfig | None = None) -> tf.distribute.Strategy | None:
    """Import TensorFlow and create its devices with file descriptor 2 hidden (native code prints CUDA probing and
    CPU-feature notes there before logging is set up); return the strategy ``distribute`` asks for, created first,
    as logical CPUs and the multi-worker runtime can only be set up before TensorFlow creates its devices."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved_stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow as tf

        from accumrun.training.distribute import create_strategy

        strategy = create_strategy(distribute) if distribute is not None else None
        tf.config.list_logical_devices()
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        os.close(devnull)
    return strategy


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="accumrun")
def main() -> None:
    """Train TensorFlow models with exact darknet-style gradient accumulation (subdivisions)."""


def run() -> None:
    """The ``accumrun`` command: :func:`main`, then, once TensorFlow is loaded, an exit that skips the interpreter's
    teardown. Tearing TensorFlow down takes 2 to 3 s after everything is written (measured on a 2-core CPU, for any
    Keras script): a user would wait it out after every run. The exit handlers still run first (they flush the logs
    and end a multi-worker run's service), other threads are waited for, and the output is flushed."""
    try:
        main(prog_name="accumrun")
    except SystemExit as done:
        if "tensorflow" not in sys.modules:
            raise
        code = done.code
    else:
        code = 0
    if not isinstance(code, int):  # sys.exit("message") or sys.exit(None), as the interpreter reads them
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more can be written
            stream.flush()
    os._exit(code)
