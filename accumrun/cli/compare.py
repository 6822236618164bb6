"""``accumrun compare``: variants of one config trained from the same weights and data order, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import accumrun
from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import SHARED_OVERRIDE_OPTIONS, PathToWrite, apply_options, overrides


def _subdivision_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int | str] | None:
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or not all(part == "auto" or (part.isdigit() and int(part) >= 1) for part in parts):
        raise click.BadParameter(f"{value!r} is not a comma-separated list of positive integers or 'auto', e.g. 8,1")
    counts = list(dict.fromkeys(part if part == "auto" else int(part) for part in parts))
    if len(counts) < 2:
        raise click.BadParameter(f"{value!r} names one count; a comparison needs two or more, e.g. 8,1")
    return counts


def _varied_key(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, list[str]] | None:
    if value is None:
        return None
    key, _, listed = value.partition("=")
    values = list(dict.fromkeys(part.strip() for part in listed.split(",") if part.strip()))
    if not key.strip() or len(values) < 2:
        raise click.BadParameter(
            f"{value!r} is not KEY=VALUE,VALUE[,...] with two values or more, e.g. optimizer.name=adam,sgd"
        )
    return key.strip(), values


class _ComparisonFolder(click.ParamType):
    """A comparison's folder, which holds its ``compare.json``; anything else is a usage error."""

    name = "dir"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        folder = Path(value)
        if not (folder / "compare.json").is_file():
            self.fail(f"{folder}: not a comparison's folder (no compare.json)", param, ctx)
        return folder


@click.command(cls=Command)
@click.argument("config_path", metavar="[CONFIG]", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--subdivisions",
    callback=_subdivision_list,
    metavar="LIST",
    help="Comma-separated subdivision counts to train, e.g. 8,4,1 or auto,1 [default: the config's, and 1].",
)
@click.option(
    "--vary",
    callback=_varied_key,
    metavar="KEY=V1,V2",
    help="Compare values of another config key instead, e.g. optimizer.name=adam,sgd.",
)
@apply_options(SHARED_OVERRIDE_OPTIONS)
@click.option("--run-dir", type=PathToWrite(file_okay=False), help="Folder for the variants and the report.")
@click.option(
    "--resume",
    "resume_dir",
    metavar="DIR",
    type=_ComparisonFolder(),
    help="Go on with the comparison in DIR that Ctrl-C stopped: resume its stopped variant, run those not started.",
)
def compare(
    config_path: str | None,
    subdivisions: list[int | str] | None,
    vary: tuple[str, list[str]] | None,
    run_dir: str | None,
    resume_dir: Path | None,
    **flags: Any,
) -> None:
    """Train CONFIG with subdivisions on and off (or with each value of the --vary key), from the same weights and
    data order, and compare.

    Each variant is a run folder of its own under the compare folder, with its TensorBoard scalars, so
    `tensorboard --logdir COMPARE_DIR` overlays them. Ctrl-C stops the variant under way with a checkpoint and
    prints the command that goes on (--resume DIR).
    """
    if vary is not None and subdivisions is not None:
        raise click.UsageError("--vary and --subdivisions each choose what to compare; give one")
    requested = overrides(**flags)
    if resume_dir is not None:
        if config_path or subdivisions or vary or run_dir or requested:
            raise click.UsageError("--resume goes on with the comparison as it was started; give it alone")
        start_tensorflow()
        comparison = accumrun.resume_compare(resume_dir)
    elif config_path is None:
        raise click.UsageError("missing CONFIG (or --resume DIR to go on with a stopped comparison)")
    else:
        start_tensorflow()
        comparison = accumrun.compare(config_path, subdivisions, run_dir, overrides=requested, vary=vary)
    click.echo(f"\n{comparison.table()}")
    png = f" and {comparison.png_path}" if comparison.png_path else ""
    click.echo(f"\nwrote {comparison.json_path}{png}")
    if comparison.failed:
        count = len(comparison.variants)
        raise click.ClickException(f"{len(comparison.failed)} of {count} variants failed; see the table above")
