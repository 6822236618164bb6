"""``accumrun make-example``: example data to try the file sources on, made here, never downloaded."""

from __future__ import annotations

from pathlib import Path

import click

from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import PathToWrite
from accumrun.data import examples


@click.command("make-example", cls=Command)
@click.argument("kind", type=click.Choice(examples.EXAMPLE_KINDS))
@click.argument("target", type=PathToWrite(path_type=Path))
@click.option(
    "--count", type=click.IntRange(min=6), default=600, show_default=True, help="Images, rows, texts or files to make."
)
@click.option("--size", type=click.IntRange(min=4), default=32, show_default=True, help="Image side in pixels.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def make_example(kind: str, target: Path, count: int, size: int, seed: int) -> None:
    """Make example data in TARGET: an image folder (images), TFRecord files named TARGET-0000i-of-00002
    (tfrecord), a CSV table (csv), a folder of short reviews, one .txt file each (text), a folder of .txt files of
    simple sentences for a language model (corpus), those sentences' bytes as nanoGPT's train.bin and val.bin of
    uint16 token ids (tokens), or the bundled digits standardized, with one-hot labels permuted at random, as an
    npz file (random-labels: configs/edge_of_stability.yaml). Nothing is downloaded."""
    examples.require_new_target(target)
    start_tensorflow()
    click.echo("\n".join(examples.make_example(kind, target, count, size, seed)))
