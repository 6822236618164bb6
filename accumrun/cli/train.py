"""``accumrun train``: train a config, or continue a stopped run."""

from __future__ import annotations

import sys
from typing import Any

import click

import accumrun
from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import TRAIN_OPTIONS, TrainOptions, apply_options


@click.command(cls=Command)
@apply_options(TRAIN_OPTIONS)
def train(**options: Any) -> None:
    """Train the model that CONFIG describes, or continue a stopped run with --resume RUN_DIR.

    Ctrl-C or SIGTERM stops after the updates under way (a batch, or the call's: about half a second of them with
    updates_per_call: auto), saves a checkpoint and prints the command that resumes the run; a second Ctrl-C stops
    at once.
    """
    request = TrainOptions(**options)
    config, target = request.resolve()
    # Before anything imports TensorFlow, so that its start-up chatter is hidden.
    strategy = start_tensorflow(config.distribute)
    from accumrun.rundir.layout import has_checkpoint
    from accumrun.training.signals import resume_command

    resume = request.resume_dir is not None
    try:
        accumrun.train(
            config, target, resume=resume, overwrite=request.overwrite, quiet=request.quiet, strategy=strategy
        )
    except KeyboardInterrupt:
        if has_checkpoint(target):
            command = resume_command(target)
            click.echo(f"\nstopped at once; resume from the last checkpoint with: {command}", err=True)
        else:
            click.echo("\nstopped before the first checkpoint; nothing to resume", err=True)
        sys.exit(130)
