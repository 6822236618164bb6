"""User-facing errors. Each prints as one line: ``Error: <key path>: <what is wrong> (got <value>)``."""

from __future__ import annotations

from typing import IO, Any

import click

_NO_VALUE = object()


def describe(path: str, what: str, value: Any = _NO_VALUE) -> str:
    """Format one problem as ``path: what (got value)``; the value part is left out when not given, and the path
    where ``what`` begins with it already (a file's problem that names the file, then a row in it)."""
    named = what.startswith(path) and what[len(path) : len(path) + 1] in (",", ":", " ")
    text = f"{path}: {what}" if path and not named else what
    if value is not _NO_VALUE:
        text += f" (got {value!r})"
    return text


class AccumrunError(click.ClickException):
    """Base of the errors that reach the user as ``Error: ...``, with exit code 1 unless a subclass says otherwise."""

    exit_code = 1

    def __init__(self, path: str, what: str, value: Any = _NO_VALUE) -> None:
        super().__init__(describe(path, what, value))
        self.path, self.what, self.value = path, what, value

    def relabelled(self, path: str) -> AccumrunError:
        """The same error, blamed on ``path`` (the option that gave the value, where the config's key did not)."""
        return type(self)(path, self.what, self.value)


class ArgumentError(AccumrunError):
    """An argument of an API call is invalid (its path is the argument's name): exit code 2, and the command line
    shows it as a usage error."""

    exit_code = 2


class ConfigError(AccumrunError):
    """The configuration (file, overrides or a value in it) is invalid."""


class DataError(AccumrunError):
    """The data cannot be loaded or does not fit the model."""


class ConfigProblems(ConfigError):
    """Several configuration problems, reported together."""

    def __init__(self, source: str, problems: list[str]) -> None:
        if len(problems) == 1:
            click.ClickException.__init__(self, problems[0])
        else:
            lines = [f"{len(problems)} problems in {source}:"] + [f"  {p}" for p in problems]
            click.ClickException.__init__(self, "\n".join(lines))
        self.problems = problems


class TrainingDiverged(click.ClickException):
    """The loss or a gradient became NaN or Inf, and ``training.on_nonfinite`` is ``stop``."""

    exit_code = 1


class Interrupted(click.ClickException):
    """SIGINT or SIGTERM stopped the run at a batch boundary, after a checkpoint; exits 128 + the signal."""

    def __init__(self, signal_number: int, reason: str, resume_command: str) -> None:
        super().__init__(f"{reason}\nresume with: {resume_command}")
        # click types exit_code as a ClassVar, but reads it from the instance, so a per-instance code works.
        self.exit_code = 128 + signal_number  # type: ignore[misc]
        self.reason = reason

    def show(self, file: IO[Any] | None = None) -> None:
        # A stop the user asked for is not an error; say where the run stands and how to go on.
        click.echo(self.message, err=True)


class WorkerLost(click.ClickException):
    """A worker of a multi-worker run stopped answering; the others stopped, and the last checkpoint is intact.

    Its exit code is ``EX_TEMPFAIL`` (75): the run is resumable, so a supervisor may simply start it again.
    """

    exit_code = 75
