"""The group every command joins, and the process around it: a bad argument is a usage error, an unexpected
exception one line, a closed stdout ends nothing, Ctrl-C exit 130 at any moment; TensorFlow starts quietly, and its
teardown is skipped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
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


STOPPED_BY_CTRL_C = 130
"""The exit code of a command that Ctrl-C stopped, whenever it came (128 + SIGINT, as a shell reports it)."""


class _Group(click.Group):
    """Turns an unexpected exception into a one-line error instead of a traceback, and Ctrl-C into exit 130 (not
    click's ``Aborted!`` and exit 1, which means bad input here); a closed stdout ends nothing."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:  # parsing the arguments: a callback may read files (a run folder's run.json)
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            raise _stopped_by_ctrl_c() from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with contextlib.redirect_stdout(_ClosedStdoutIgnored(sys.stdout)):
                return super().invoke(ctx)
        except KeyboardInterrupt:
            # A command that has more to say of its stop (train: how to resume) says it and exits 130 itself.
            raise _stopped_by_ctrl_c() from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except Exception as error:
            if os.environ.get("ACCUMRUN_TRACEBACK"):
                traceback.print_exc()
            raise click.ClickException(_explain_unexpected(error)) from None


def _stopped_by_ctrl_c() -> click.exceptions.Exit:
    click.echo("\nstopped by Ctrl-C", err=True)
    return click.exceptions.Exit(STOPPED_BY_CTRL_C)


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_CALL_HEADER = re.compile(r"^Exception encountered when calling (.+)\.$")


def _explain_unexpected(error: Exception) -> str:
    """One line for an error accumrun did not foresee: the path and the reason where the file system refused a path,
    else its class, where it was raised if known, and its cause."""
    name = type(error).__name__
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        # The file system refused a path (permission, a full disk, a read-only folder): the path and why say it all.
        return f"{error.filename}: {error.strerror}"
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
    and end a multi-worker run's service), other threads are waited for, and the output is flushed. Ctrl-C while
    the process ends ends it at once, with 130."""
    try:
        main(prog_name="accumrun")
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:  # after the command, before click's own handling ends (tearing its context down)
        code = STOPPED_BY_CTRL_C
    else:
        code = 0
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when started with SIGINT ignored
        signal.signal(signal.SIGINT, _exit_at_once)
    if not _tensorflow_loaded():
        sys.exit(code)
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


def _tensorflow_loaded() -> bool:
    """Whether any of TensorFlow is loaded: all of it, or what an import that Ctrl-C cut short left (its native
    libraries included, which the interpreter's teardown may hang or crash on)."""
    return any(name == "tensorflow" or name.startswith("tensorflow.") for name in sys.modules)


def _exit_at_once(number: int, frame: Any) -> None:
    """SIGINT's handler once the command has ended: nothing is left to stop at a boundary, so exit 130 now."""
    os._exit(STOPPED_BY_CTRL_C)
