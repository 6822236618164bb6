"""``accumrun plot``: the loss curves of runs, and of comparisons' variants, in one figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from accumrun.cli.group import Command
from accumrun.cli.options import PathToWrite

PLOT_FORMATS = (".png", ".pdf", ".svg")
"""What ``--out`` may be: the formats Matplotlib writes without another library."""


class _PlottedFolder(click.ParamType):
    """A run's folder, or a comparison's (it holds ``compare.json``): what ``plot`` draws."""

    name = "run_dir"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        folder = Path(value)
        if (folder / "compare.json").is_file():
            return folder
        if not (folder / "run.json").is_file():
            raise click.UsageError(f"{folder}: not a run folder (no run.json) nor a comparison's (no compare.json)")
        return folder


@click.command(cls=Command)
@click.argument("run_dirs", nargs=-1, required=True, type=_PlottedFolder())
@click.option(
    "--out",
    type=PathToWrite(dir_okay=False, suffixes=PLOT_FORMATS),
    default="plot.png",
    show_default=True,
    help="The figure to write: a .png, .pdf or .svg file.",
)
def plot(run_dirs: tuple[Path, ...], out: str) -> None:
    """Plot the training and validation loss of one or more run directories together; a comparison's folder
    (accumrun compare) draws each of its variants, an unfinished one named with its status, and names those with
    nothing to draw above the panels."""
    from accumrun.reports.compare import compared_curves, unplotted_variants
    from accumrun.reports.plot import plot_curves
    from accumrun.rundir.metrics import load_metrics

    curves, unplotted = {}, []
    for folder in run_dirs:
        name = folder.name or str(folder)
        if (folder / "compare.json").is_file():
            prefix = f"{name}: " if len(run_dirs) > 1 else ""
            curves.update({prefix + variant: rows for variant, rows in compared_curves(folder).items()})
            unplotted += [prefix + variant for variant in unplotted_variants(folder)]
        else:
            curves[name] = load_metrics(folder)
    title = f"no rows to draw: {', '.join(unplotted)}" if unplotted else ""
    click.echo(f"wrote {plot_curves(curves, Path(out), title=title)}")
