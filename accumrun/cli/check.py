"""``accumrun check``: a config validated and resolved, and optionally its memory estimate."""

from __future__ import annotations

from typing import Any

import click

from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import OVERRIDE_OPTIONS, apply_options, overrides


@click.command(cls=Command)
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@apply_options(OVERRIDE_OPTIONS)
@click.option("--memory", is_flag=True, help="Also estimate the memory per sub-batch size, to choose subdivisions.")
def check(config_path: str, memory: bool, **flags: Any) -> None:
    """Validate CONFIG and print it resolved, with the derived batch sizes."""
    from accumrun.config.loading import load_config

    config = load_config(config_path, overrides(**flags))
    start_tensorflow()
    from accumrun.training.console import describe_setup
    from accumrun.training.setup import build_training

    setup = build_training(config)
    click.echo(setup.config.to_yaml().rstrip())
    click.echo("---")
    click.echo("\n".join(describe_setup(setup)))
    if setup.stepped.subdivisions is not None:  # auto settles them, and with them the observers, when it trains
        from accumrun.core.observers import Observers
        from accumrun.training.measurements import measurement_notes

        observers = Observers(setup.stepped.step_spec(setup.stepped.subdivisions).observers)
        for note in measurement_notes(setup.config.training, observers):
            click.echo(note)
    if memory:
        from accumrun.reports.memory import memory_report

        report = memory_report(
            setup.trained.model,
            setup.trained.optimizer,
            setup.fed.batch_size,
            config.training.fixed_subdivisions,
            sample_bytes=setup.fed.dataset.dtype.itemsize,
            feed=setup.fed.feed,
        )
        click.echo("\n".join(report))
