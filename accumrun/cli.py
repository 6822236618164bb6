"""The command line: parse, load the config, call the runner, map failures to exit codes.

TensorFlow is imported inside the command bodies only, so ``accumrun --help`` answers at once.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from accumrun import __version__

if TYPE_CHECKING:
    from accumrun.config import DistributeConfig


class _BatchSize(click.ParamType):
    name = "N|full"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if text == "full" or (text.isdigit() and int(text) >= 1):
            return text
        self.fail(f"{value!r} is neither a positive integer nor 'full'", param, ctx)


class _Group(click.Group):
    """Turns any unexpected exception into a one-line error instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:
            if os.environ.get("ACCUMRUN_TRACEBACK"):
                traceback.print_exc()
            raise click.ClickException(_explain_unexpected(error)) from None


def _explain_unexpected(error: Exception) -> str:
    if type(error).__name__ == "ResourceExhaustedError":
        return "out of memory: raise training.subdivisions to shrink the sub-batch"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    # An error raised inside a tf.function opens with "in user code:" and a stack; the cause is the last line.
    cause = lines[-1] if lines[0] == "in user code:" else lines[0]
    return f"unexpected {type(error).__name__}: {cause} (set ACCUMRUN_TRACEBACK=1 to see where)"


def _config_options(command, config_required: bool = True):
    """The options shared by the commands that read a config: all of them are overrides of its keys."""
    options = [
        click.argument("config_path", metavar="CONFIG", required=config_required, type=click.Path(dir_okay=False)),
        click.option("--subdivisions", type=click.IntRange(min=1), help="Override training.subdivisions."),
        click.option("--no-subdivisions", is_flag=True, help="Train with subdivisions: 1 (plain training)."),
        click.option("--epochs", type=click.IntRange(min=1), help="Override training.epochs."),
        click.option("--batch-size", type=_BatchSize(), help="Override training.batch_size (N or 'full')."),
        click.option(
            "--set",
            "assignments",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override any key, e.g. --set optimizer.learning_rate=0.01 (repeatable).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _overrides(
    assignments: tuple[str, ...],
    subdivisions: int | None,
    no_subdivisions: bool,
    epochs: int | None,
    batch_size: str | None,
) -> list[str]:
    """The ``--set`` assignments, then the dedicated flags (which win, being more specific)."""
    if no_subdivisions and subdivisions is not None:
        raise click.UsageError("--subdivisions and --no-subdivisions exclude each other")
    overrides = list(assignments)
    if no_subdivisions:
        overrides.append("training.subdivisions=1")
    if subdivisions is not None:
        overrides.append(f"training.subdivisions={subdivisions}")
    if epochs is not None:
        overrides.append(f"training.epochs={epochs}")
    if batch_size is not None:
        overrides.append(f"training.batch_size={batch_size}")
    return overrides


def _quiet_tensorflow(distribute: DistributeConfig | None = None) -> None:
    """Import TensorFlow and create its devices with the C++ start-up chatter hidden.

    TensorFlow prints CUDA probing and CPU-feature notes to file descriptor 2 before its logging is set up,
    so no environment variable silences them; a failed import still raises its Python exception afterwards.
    With a ``distribute`` config section, its strategy is created first: logical CPUs and the multi-worker
    runtime can only be set up before TensorFlow creates its devices.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved_stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow as tf

        if distribute is not None:
            from accumrun.distribute import create_strategy

            create_strategy(distribute)
        tf.config.list_logical_devices()
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        os.close(devnull)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="accumrun")
def main() -> None:
    """Train TensorFlow models with exact darknet-style gradient accumulation (subdivisions)."""


@main.command()
@functools.partial(_config_options, config_required=False)
@click.option("--run-dir", type=click.Path(file_okay=False), help="Write the run here instead of output.run_dir.")
@click.option(
    "--resume",
    "resume_dir",
    metavar="RUN_DIR",
    type=click.Path(file_okay=False),
    help="Continue the run in RUN_DIR from its latest checkpoint (CONFIG is optional; --epochs may extend it).",
)
@click.option("--overwrite", is_flag=True, help="Replace the run already in the run directory.")
@click.option("--no-tensorboard", is_flag=True, help="Do not write TensorBoard scalars (output.tensorboard).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def train(
    config_path: str | None,
    subdivisions: int | None,
    no_subdivisions: bool,
    epochs: int | None,
    batch_size: str | None,
    assignments: tuple[str, ...],
    run_dir: str | None,
    resume_dir: str | None,
    overwrite: bool,
    no_tensorboard: bool,
    quiet: bool,
) -> None:
    """Train the model that CONFIG describes, or continue a stopped run with --resume RUN_DIR.

    Ctrl-C or SIGTERM stops at the end of the current batch, saves a checkpoint and prints the command that
    resumes the run; a second Ctrl-C stops at once.
    """
    from accumrun.config import load_config, load_resume_config

    if resume_dir is None and config_path is None:
        raise click.UsageError("missing CONFIG (or --resume RUN_DIR to continue a run)")
    if resume_dir is not None and (run_dir or overwrite):
        raise click.UsageError("--resume continues the run in its own directory; drop --run-dir and --overwrite")
    overrides = _overrides(assignments, subdivisions, no_subdivisions, epochs, batch_size)
    if no_tensorboard:
        overrides.append("output.tensorboard=false")
    if resume_dir is not None:
        config = load_resume_config(Path(resume_dir), config_path, overrides)
    else:
        config = load_config(config_path, overrides)
    _quiet_tensorflow(config.distribute)
    from accumrun.checkpoints import CheckpointStore
    from accumrun.run import resolve_run_dir
    from accumrun.run import train as run_training

    if resume_dir is not None:
        target = Path(resume_dir)
    else:
        target = Path(run_dir) if run_dir else resolve_run_dir(config.output.run_dir, Path(config_path).stem)
    try:
        run_training(config, target, quiet=quiet, resume=resume_dir is not None, overwrite=overwrite)
    except KeyboardInterrupt:
        if CheckpointStore(target / "checkpoints", keep=1).latest() is not None:
            command = f"accumrun train --resume {shlex.quote(str(target))}"
            click.echo(f"\nstopped at once; resume from the last checkpoint with: {command}", err=True)
        else:
            click.echo("\nstopped before the first checkpoint; nothing to resume", err=True)
        sys.exit(130)


@main.command()
@_config_options
@click.option("--memory", is_flag=True, help="Also estimate the memory per sub-batch size, to choose subdivisions.")
def check(
    config_path: str,
    subdivisions: int | None,
    no_subdivisions: bool,
    epochs: int | None,
    batch_size: str | None,
    assignments: tuple[str, ...],
    memory: bool,
) -> None:
    """Validate CONFIG and print it resolved, with the derived batch sizes."""
    from accumrun.config import load_config

    overrides = _overrides(assignments, subdivisions, no_subdivisions, epochs, batch_size)
    config = load_config(config_path, overrides)
    _quiet_tensorflow()
    from accumrun.console import describe_setup
    from accumrun.run import build_training

    setup = build_training(config)
    click.echo(config.to_yaml().rstrip())
    click.echo("---")
    click.echo("\n".join(describe_setup(config, setup.dataset, setup.model, setup.batch_size)))
    if memory:
        from accumrun.memory import estimate_memory, format_estimate
        from accumrun.split import sub_batch_sizes

        configured = config.training.subdivisions if config.training.subdivisions != "auto" else None
        traced = max(sub_batch_sizes(setup.batch_size, configured or 1))
        estimate = estimate_memory(setup.model, setup.optimizer, setup.dataset.sample_shape, setup.batch_size, traced)
        click.echo("\n".join(format_estimate(estimate, setup.batch_size, configured)))


def _subdivision_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 8,1") from None
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{value!r} needs positive integers, e.g. 8,1")
    return list(dict.fromkeys(counts))


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option(
    "--subdivisions",
    "subdivision_counts",
    callback=_subdivision_list,
    metavar="LIST",
    help="Comma-separated subdivision counts to train, e.g. 8,4,1 [default: the config's, and 1].",
)
@click.option("--epochs", type=click.IntRange(min=1), help="Override training.epochs.")
@click.option("--batch-size", type=_BatchSize(), help="Override training.batch_size (N or 'full').")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Override any key (repeatable).")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Folder for the variants and the report.")
def compare(
    config_path: str,
    subdivision_counts: list[int] | None,
    epochs: int | None,
    batch_size: str | None,
    assignments: tuple[str, ...],
    run_dir: str | None,
) -> None:
    """Train CONFIG with subdivisions on and off, from the same weights and data order, and compare."""
    from accumrun.config import load_config

    overrides = _overrides(assignments, None, False, epochs, batch_size)
    config = load_config(config_path, overrides)
    if subdivision_counts is None:
        if config.training.subdivisions == 1:
            raise click.UsageError("the config trains with subdivisions 1; pass --subdivisions LIST, e.g. 8,1")
        subdivision_counts = [config.training.subdivisions, 1]
    _quiet_tensorflow()
    from accumrun.compare import format_table, run_variants, write_report
    from accumrun.run import resolve_run_dir

    stem = Path(config_path).stem
    out_dir = Path(run_dir) if run_dir else resolve_run_dir("runs/compare-{config_name}-{timestamp}", stem)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise click.UsageError(f"{out_dir} exists and is not empty; choose another --run-dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = run_variants(Path(config_path), overrides, subdivision_counts, out_dir)
    click.echo("")
    click.echo(format_table(variants))
    json_path, png_path = write_report(variants, out_dir, Path(config_path))
    click.echo(f"\nwrote {json_path}" + (f" and {png_path}" if png_path else ""))
    failed = [v for v in variants if v.status != "completed"]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(variants)} variants failed; see the table above")


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default="plot.png", show_default=True, help="PNG to write.")
def plot(run_dirs: tuple[str, ...], out: str) -> None:
    """Plot the training and validation loss of one or more run directories together."""
    from accumrun.plot import load_metrics, plot_curves

    curves = {Path(run_dir).name or run_dir: load_metrics(Path(run_dir)) for run_dir in run_dirs}
    click.echo(f"wrote {plot_curves(curves, Path(out))}")


@main.command()
@click.argument("dataset", type=click.Choice(["mnist", "fashion_mnist"]))
@click.option("--to", "folder", type=click.Path(file_okay=False), help="Folder for the files [default: datasets/NAME].")
@click.option(
    "--base-url", help="Fetch from this mirror (a URL or a local http server) instead of the official source."
)
def download(dataset: str, folder: str | None, base_url: str | None) -> None:
    """Download the four IDX files of DATASET, verify their checksums and write them atomically."""
    from accumrun.data import DATASETS_DIR
    from accumrun.download import download_dataset

    target = Path(folder) if folder else DATASETS_DIR / dataset
    download_dataset(dataset, target, base_url=base_url, echo=click.echo)
    click.echo(f"{dataset} is ready in {target}")
