"""``accumrun export``: a finished run's model as a TensorFlow SavedModel."""

from __future__ import annotations

from pathlib import Path

import click

import accumrun
from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import MODEL_OPTION, RUN_FOLDER, PathToWrite


@click.command(cls=Command)
@click.argument("run_dir", type=RUN_FOLDER)
@click.option("--format", "format_", type=click.Choice(["savedmodel"]), default="savedmodel", show_default=True)
@click.option(
    "--output", type=PathToWrite(file_okay=False, path_type=Path), help="[default: RUN_DIR/export/savedmodel]"
)
@click.option("--overwrite", is_flag=True, help="Replace what is at the output.")
@MODEL_OPTION
def export(run_dir: Path, format_: str, output: Path | None, overwrite: bool, model: str) -> None:
    """Export a finished run's model as a TensorFlow SavedModel whose serving signature takes raw samples and
    returns probabilities (and, for classification, class_index and class_name)."""
    start_tensorflow()
    click.echo(accumrun.export(run_dir, output, overwrite=overwrite, model=model).describe())
