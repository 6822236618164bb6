"""``accumrun plan``: each candidate's peak memory and time per sample, measured by probes, before a run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from accumrun.cli.group import Command, start_tensorflow
from accumrun.cli.options import OVERRIDE_OPTIONS, apply_options, overrides
from accumrun.kinds import Kind, Precision, Remat
from accumrun.rundir.atomic import write_text_atomically

F = TypeVar("F", bound=Callable[..., Any])


def _each_of(key: str, values: type[Kind], help_text: str) -> Callable[[F], F]:
    """``--KEY``, repeatable, one of ``values``: each given value of ``training.KEY`` planned for (as ``KEYs``)."""
    return click.option(
        f"--{key}", f"{key}s", multiple=True, type=click.Choice([value.value for value in values]), help=help_text
    )


@click.command(cls=Command)
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@apply_options(OVERRIDE_OPTIONS)
@click.option("--memory-budget", metavar="SIZE", help="The budget to fit (6GiB, 512MiB); training.memory_budget's.")
@_each_of(
    "precision",
    Precision,
    "A precision to plan for (repeatable): a row per candidate under each; the configured one by default.",
)
@_each_of(
    "remat",
    Remat,
    "A training.remat mode to plan for (repeatable); the configured one, or for auto every mode the model takes.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    callback=lambda context, parameter, value: _writable(value),
    help="Also write the table to this JSON file.",
)
def plan(
    config_path: str,
    memory_budget: str | None,
    precisions: tuple[str, ...],
    remats: tuple[str, ...],
    json_path: str | None,
    **flags: Any,
) -> None:
    """Plan CONFIG's memory: fixed bytes by arithmetic, activations and speed from probes in fresh processes, a row
    per candidate, and the fastest that fits as --set overrides. Writes nothing to runs/."""
    from accumrun.config.loading import load_config

    extra = [f"training.memory_budget={memory_budget}"] if memory_budget is not None else []
    config = load_config(config_path, [*overrides(**flags), *extra])
    start_tensorflow()
    from accumrun.training.budget import check_budget, remat_modes, setup_footprint
    from accumrun.training.plan import make_plan
    from accumrun.training.plan_table import plan_document, plan_lines
    from accumrun.training.probe import measure_in_fresh_process
    from accumrun.training.setup import build_training

    setup = build_training(config)
    check_budget(setup)
    # remat: auto is none in a run without a budget; a plan shows each mode it could choose.
    auto_remats = [mode.value for mode in remat_modes(config)] if config.training.remat == "auto" else []
    made = make_plan(
        config,
        setup_footprint(setup),
        config.training.budget_bytes,
        [
            ("training.precision", precisions),
            ("training.remat", remats or auto_remats),
        ],
        measure_in_fresh_process,
        lambda line: click.echo(line, err=True),
    )
    click.echo("\n".join(plan_lines(made)))
    if json_path is not None:
        write_text_atomically(Path(json_path), json.dumps(plan_document(made), indent=2) + "\n")


def _writable(path: str | None) -> str | None:
    """``--json``'s file, refused before any probe runs when its folder is not there."""
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise click.BadParameter(f"its folder {Path(path).parent} does not exist")
    return path
