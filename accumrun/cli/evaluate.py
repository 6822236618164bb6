"""``accumrun evaluate``: a finished run's model scored on a split or on other data."""

from __future__ import annotations

from pathlib import Path

import click

import accumrun
from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import MODEL_OPTION, RUN_FOLDER
from accumrun.kinds import Split


@click.command(cls=Command)
@click.argument("run_dir", type=RUN_FOLDER)
@click.option(
    "--split", type=click.Choice(Split.words()), default=Split.VAL.value, show_default=True, help="What to score."
)
@click.option("--data", "data_path", metavar="PATH", help="Score all of this source (of the run's kind) instead.")
@MODEL_OPTION
def evaluate(run_dir: Path, split: str, data_path: str | None, model: str) -> None:
    """Score a finished run's model with its loss and metrics; write RUN_DIR/eval-<split>.json."""
    start_tensorflow()
    from accumrun.reports.evaluate import describe

    click.echo(describe(accumrun.evaluate(run_dir, split, data=data_path, model=model)))
