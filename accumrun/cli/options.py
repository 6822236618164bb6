"""The arguments and options that several commands share: their types, their checks, and the config overrides they
make."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from accumrun.errors import ArgumentError
from accumrun.kinds import ModelFile

if TYPE_CHECKING:
    from accumrun.config.schema import Config

F = TypeVar("F", bound=Callable[..., Any])


class PathToWrite(click.Path):
    """A file or folder that the command creates: a file in its way (at a folder's path, or above the path), or a
    file name without one of ``suffixes`` (the formats it can write), is a usage error, found before anything runs."""

    def __init__(self, *, suffixes: Sequence[str] = (), **options: Any) -> None:
        super().__init__(**options)
        self.suffixes = suffixes

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = super().convert(value, param, ctx)
        path = Path(os.fsdecode(converted))
        above = next((parent for parent in path.parents if parent.exists()), None)
        if above is not None and not above.is_dir():
            self.fail(f"{path}: {above} is a file, not a folder", param, ctx)
        if self.suffixes and path.suffix.lower() not in self.suffixes:
            *others, last = self.suffixes
            self.fail(f"{path}: name a {', '.join(others)}{' or ' if others else ''}{last} file", param, ctx)
        return converted


class _PositiveOr(click.ParamType):
    """A positive integer, or one word (``full`` for batch sizes, ``auto`` for subdivisions)."""

    def __init__(self, word: str) -> None:
        self.word = word
        self.name = f"N|{word}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if text == self.word or (text.isdigit() and int(text) >= 1):
            return text
        self.fail(f"{value!r} is neither a positive integer nor '{self.word}'", param, ctx)


class _RunFolder(click.ParamType):
    """A run's folder, which holds its ``run.json``; anything else is a usage error, worded alike for every command."""

    name = "run_dir"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        from accumrun.rundir.layout import require_run_folder

        try:
            return require_run_folder(Path(value))
        except ArgumentError as error:
            raise click.UsageError(error.message, ctx) from None


RUN_FOLDER = _RunFolder()

_ASSIGNMENT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*=")


def _assignments(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--set`` values must read KEY=VALUE with a dotted key; anything else is a usage error."""
    for value in values:
        if not _ASSIGNMENT.match(value):
            raise click.BadParameter(
                f"{value!r} is not KEY=VALUE with a dotted key, e.g. training.subdivisions=4", ctx, param
            )
    return values


def apply_options(options: Sequence[Callable[[Any], Any]]) -> Callable[[F], F]:
    """Apply a list of click arguments and options to a command, in the order they are listed."""
    return lambda command: functools.reduce(lambda decorated, option: option(decorated), reversed(options), command)


# The overrides that compare takes too, beside its own --subdivisions.
SHARED_OVERRIDE_OPTIONS = [
    click.option("--epochs", type=click.IntRange(min=1), help="Override training.epochs."),
    click.option("--batch-size", type=_PositiveOr("full"), help="Override training.batch_size (N or 'full')."),
    click.option(
        "--set",
        "assignments",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_assignments,
        help="Override any key, e.g. --set optimizer.learning_rate=0.01 (repeatable).",
    ),
]

# The options of the commands that read a config: all of them are overrides of its keys.
OVERRIDE_OPTIONS = [
    click.option("--subdivisions", type=_PositiveOr("auto"), help="Override training.subdivisions (N or 'auto')."),
    click.option("--no-subdivisions", is_flag=True, help="Train with subdivisions: 1 (plain training)."),
    *SHARED_OVERRIDE_OPTIONS,
]

# train's argument and options, declared once: `launch` takes the same and passes them on to every worker.
TRAIN_OPTIONS = [
    click.argument("config_path", metavar="[CONFIG]", required=False, type=click.Path(dir_okay=False)),
    *OVERRIDE_OPTIONS,
    click.option("--run-dir", type=PathToWrite(file_okay=False), help="Write the run here instead of output.run_dir."),
    click.option(
        "--resume",
        "resume_dir",
        metavar="RUN_DIR",
        type=RUN_FOLDER,
        help="Continue the run in RUN_DIR from its latest checkpoint (CONFIG is optional; --epochs may extend it).",
    ),
    click.option("--overwrite", is_flag=True, help="Replace the run already in the run directory."),
    click.option("--no-tensorboard", is_flag=True, help="Do not write TensorBoard scalars (output.tensorboard)."),
    click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors."),
]

MODEL_OPTION = click.option(
    "--model",
    type=click.Choice(ModelFile.words()),
    default=ModelFile.FINAL.value,
    show_default=True,
    help="final (model.keras) or best (model.best.keras, kept with output.keep_best).",
)


def overrides(
    assignments: tuple[str, ...],
    subdivisions: str | None = None,
    no_subdivisions: bool = False,
    epochs: int | None = None,
    batch_size: str | None = None,
) -> list[str]:
    """The ``--set`` assignments, then the dedicated flags (which win, being more specific)."""
    if no_subdivisions and subdivisions is not None:
        raise click.UsageError("--subdivisions and --no-subdivisions exclude each other")
    flags = {"subdivisions": "1" if no_subdivisions else subdivisions, "epochs": epochs, "batch_size": batch_size}
    return [*assignments, *(f"training.{key}={value}" for key, value in flags.items() if value is not None)]


@dataclass(frozen=True)
class TrainOptions:
    """What train's argument and options ask for, as click parsed them."""

    config_path: str | None
    subdivisions: str | None
    no_subdivisions: bool
    epochs: int | None
    batch_size: str | None
    assignments: tuple[str, ...]
    run_dir: str | None
    resume_dir: Path | None
    overwrite: bool
    no_tensorboard: bool
    quiet: bool

    def resolve(self) -> tuple[Config, Path]:
        """The config to train and its run directory: CONFIG with the overrides, in --run-dir or its
        ``output.run_dir`` resolved now, or the resumed run's own config (CONFIG checked against it) and folder."""
        from accumrun.config.loading import load_config, load_resume_config
        from accumrun.rundir.layout import resolve_run_dir

        if self.resume_dir is None and self.config_path is None:
            raise click.UsageError("missing CONFIG (or --resume RUN_DIR to continue a run)")
        if self.resume_dir is not None and (self.run_dir or self.overwrite):
            raise click.UsageError("--resume continues the run in its own directory; drop --run-dir and --overwrite")
        requested = overrides(self.assignments, self.subdivisions, self.no_subdivisions, self.epochs, self.batch_size)
        if self.no_tensorboard:
            requested.append("output.tensorboard=false")
        if self.resume_dir is not None:
            return load_resume_config(self.resume_dir, self.config_path, requested), self.resume_dir
        assert self.config_path is not None  # checked above
        config = load_config(self.config_path, requested)
        if self.run_dir:
            return config, Path(self.run_dir)
        return config, resolve_run_dir(config.output.run_dir, Path(self.config_path).stem)
