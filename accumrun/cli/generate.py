"""``accumrun generate``: a finished language model's run continues a prompt, printed as it is written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

import accumrun
from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import MODEL_OPTION, RUN_FOLDER


@click.command(cls=Command)
@click.argument("run_dir", type=RUN_FOLDER)
@click.option("--prompt", required=True, help="The text to continue.")
@click.option("--max-tokens", type=click.IntRange(min=0), default=200, show_default=True, help="Tokens to write.")
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="0: the most likely token each time; above 0: drawn from the softmax of the logits divided by it.",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seeds the draws.")
@MODEL_OPTION
def generate(run_dir: Path, prompt: str, **options: Any) -> None:
    """Continue --prompt with a finished language model's run (data.task: causal_lm); print the prompt, then the
    text as the model writes it.

    Any --max-tokens runs: Ctrl-C stops it, keeping what was printed (exit 130).
    """
    # Ctrl-C is the group's: "stopped by Ctrl-C" and exit 130, the text so far kept as the output.
    start_tensorflow()
    try:
        accumrun.generate(run_dir, prompt, on_text=_show_piece, **options)
    except _ReaderGone:
        return
    click.echo()


class _ReaderGone(Exception):
    """The output's reader has gone (``accumrun generate ... | head``)."""


def _show_piece(piece: str) -> None:
    """Print a piece of generated text at once (click.echo flushes); raise :class:`_ReaderGone` once the reader of
    the output has gone: unlike a run, whose folder is what counts, the text is all that generation makes."""
    click.echo(piece, nl=False)
    if getattr(sys.stdout, "reader_gone", False):
        raise _ReaderGone
