"""``accumrun launch``: one multi-worker run as local processes of ``accumrun train``."""

from __future__ import annotations

import sys
from typing import Any

import click
from click.core import ParameterSource

from accumrun.cli.group import Command
from accumrun.cli.options import TRAIN_OPTIONS, TrainOptions, apply_options
from accumrun.cli.train import train


@click.command(cls=Command)
@click.option("--workers", type=click.IntRange(min=1), required=True, help="How many local workers to start.")
@apply_options(TRAIN_OPTIONS)
@click.pass_context
def launch(ctx: click.Context, workers: int, **options: Any) -> None:
    """Start WORKERS local processes of one multi-worker run: `accumrun train` with the same CONFIG and train
    options (--resume RUN_DIR among them), TF_CONFIG on free localhost ports, output prefixed [w0], [w1], ...

    Ctrl-C and SIGTERM are passed on to every worker, which stop at the same batch after a checkpoint. The
    launcher exits with worker 0's status, or 75 if worker 0 is lost.
    """
    from accumrun.launcher import launch as launch_workers
    from accumrun.launcher import resume_hint

    request = TrainOptions(**options)
    config, target = request.resolve()
    args = _given_train_options(ctx)
    if request.resume_dir is None and not request.run_dir:
        args.append(f"--run-dir={target}")  # resolved once here, so that every worker writes to the same folder
    args.append("--set=distribute.strategy=multi_worker")
    code = launch_workers(workers, args, click.echo, grace_seconds=config.distribute.timeout_seconds + 30)
    hint = resume_hint(workers, target)
    if code != 0 and hint is not None:
        click.echo(f"[launch] resume with: {hint}", err=True)
    sys.exit(code)


def _given_train_options(ctx: click.Context) -> list[str]:
    """The train options given to ``ctx``'s command (not those left at their default), as `accumrun train` args."""
    args: list[str] = []
    for param in train.params:
        assert param.name is not None  # every parameter of train is named
        if ctx.get_parameter_source(param.name) in (None, ParameterSource.DEFAULT):
            continue
        value = ctx.params[param.name]
        flag = max(param.opts, key=len)
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif isinstance(param, click.Option) and param.is_flag:
            args.append(flag)
        else:
            args += [f"{flag}={each}" for each in (value if param.multiple else [value])]
    return args
