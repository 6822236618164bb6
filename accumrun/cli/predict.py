"""``accumrun predict``: new inputs labelled by a finished run's model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import accumrun
from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import MODEL_OPTION, RUN_FOLDER, PathToWrite


@click.command(cls=Command)
@click.argument("run_dir", type=RUN_FOLDER)
@click.argument("inputs", metavar="INPUT...", nargs=-1, required=True)
@click.option(
    "--output",
    type=PathToWrite(dir_okay=False, path_type=Path, suffixes=(".csv", ".json")),
    help="Write a .csv or .json file.",
)
@click.option("--top-k", type=click.IntRange(min=1), help="Classes per row [default: up to 5].")
@click.option("--lines", is_flag=True, help="Text runs: each line of a .txt file is one input.")
@MODEL_OPTION
def predict(run_dir: Path, inputs: tuple[str, ...], output: Path | None, **options: Any) -> None:
    """Label new inputs with a finished run's model: image files or folders, an .npz with x, a CSV, or .txt files.

    Prints a table, or writes one row per input to --output (CSV, or JSON for a .json name).
    """
    start_tensorflow()
    predictions = accumrun.predict(run_dir, inputs, show_progress=True, **options)
    if output is None:
        click.echo(predictions.table())
    else:
        count = len(predictions.rows)
        click.echo(f"wrote {count:,} prediction{'' if count == 1 else 's'} to {predictions.write(output)}")
