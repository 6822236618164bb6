"""The command line: parse, load the config, call the Python API, map failures to exit codes.

TensorFlow is imported inside the command bodies only, so ``accumrun --help`` answers at once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

import accumrun
from accumrun._version import __version__
from accumrun.data.sources import DOWNLOADABLE

if TYPE_CHECKING:
    import tensorflow as tf

    from accumrun.config.schema import DistributeConfig

F = TypeVar("F", bound=Callable[..., Any])


class _PositiveOr(click.ParamType):
    """A positive integer, or one word (``full`` for batch sizes, ``auto`` for subdivisions)."""

    def __init__(self, word: str) -> None:
        self.word = word
        self.name = f"N|{word}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if text == self.word or (text.isdigit() and int(text) >= 1):
            return text
        self.fail(f"{value!r} is neither a positive integer nor '{self.word}'", param, ctx)


_ASSIGNMENT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*=")


def _assignments(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--set`` values must read KEY=VALUE with a dotted key; anything else is a usage error."""
    for value in values:
        if not _ASSIGNMENT.match(value):
            raise click.BadParameter(
                f"{value!r} is not KEY=VALUE with a dotted key, e.g. training.subdivisions=4", ctx, param
            )
    return values


_SET_OPTION = click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_assignments,
    help="Override any key, e.g. --set optimizer.learning_rate=0.01 (repeatable).",
)


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


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_CALL_HEADER = re.compile(r"^Exception encountered when calling (.+)\.$")


def _explain_unexpected(error: Exception) -> str:
    """One line for an error accumrun did not foresee: its class, where it was raised if known, and its cause."""
    name = type(error).__name__
    if name == "ResourceExhaustedError":
        return "out of memory: raise training.subdivisions to shrink the sub-batch"
    lines = [line.strip() for line in _ANSI_ESCAPE.sub("", str(error)).splitlines() if line.strip()] or [""]
    if lines[0] == "in user code:":
        # Raised inside a tf.function: a stack, then the error again as "<class>: <message>" on lines of its own.
        starts = [i for i, line in enumerate(lines) if line.startswith(f"{name}: ")]
        lines = [lines[starts[-1]].removeprefix(f"{name}: "), *lines[starts[-1] + 1 :]] if starts else lines[-1:]
    where = ""
    # Keras wraps an error in a layer's call: "Exception encountered when calling X.call().", then the message.
    header = _KERAS_CALL_HEADER.match(lines[0])
    if header and len(lines) > 1:
        where, lines = f" in {header.group(1)}", lines[1:]
    return f"unexpected {name}{where}: {lines[0]} (set ACCUMRUN_TRACEBACK=1 to see where)"


def _config_options(command: F, config_required: bool = True) -> F:
    """The options shared by the commands that read a config: all of them are overrides of its keys."""
    options = [
        click.argument("config_path", metavar="CONFIG", required=config_required, type=click.Path(dir_okay=False)),
        click.option("--subdivisions", type=_PositiveOr("auto"), help="Override training.subdivisions (N or 'auto')."),
        click.option("--no-subdivisions", is_flag=True, help="Train with subdivisions: 1 (plain training)."),
        click.option("--epochs", type=click.IntRange(min=1), help="Override training.epochs."),
        click.option("--batch-size", type=_PositiveOr("full"), help="Override training.batch_size (N or 'full')."),
        _SET_OPTION,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _overrides(
    assignments: tuple[str, ...],
    subdivisions: str | None,
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


@contextlib.contextmanager
def _native_stderr_hidden() -> Iterator[None]:
    """Hide what native code writes to file descriptor 2 while TensorFlow starts.

    TensorFlow prints CUDA probing and CPU-feature notes there before its logging is set up, so no environment
    variable silences them; a failed import still raises its Python exception afterwards.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved_stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        os.close(devnull)


def _start_tensorflow(distribute: DistributeConfig | None = None) -> tf.distribute.Strategy | None:
    """Import TensorFlow and create its devices quietly; return the strategy ``distribute`` asks for.

    The strategy is created first: logical CPUs and the multi-worker runtime can only be set up before
    TensorFlow creates its devices. This is the one place the command line creates it.
    """
    with _native_stderr_hidden():
        import tensorflow as tf

        from accumrun.training.distribute import create_strategy

        strategy = create_strategy(distribute) if distribute is not None else None
        tf.config.list_logical_devices()
    return strategy


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
    subdivisions: str | None,
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
    from accumrun.config.loading import load_config, load_resume_config

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
        assert config_path is not None  # checked above
        config = load_config(config_path, overrides)
    # Before anything imports TensorFlow (the run folder's modules do), so that its start-up chatter is hidden.
    strategy = _start_tensorflow(config.distribute)
    if resume_dir is not None:
        target = Path(resume_dir)
    else:
        target = Path(run_dir) if run_dir else _resolve_run_dir(config.output.run_dir, str(config_path))
    from accumrun.training.checkpoints import CheckpointStore
    from accumrun.training.signals import resume_command

    try:
        accumrun.train(
            config, target, resume=resume_dir is not None, overwrite=overwrite, quiet=quiet, strategy=strategy
        )
    except KeyboardInterrupt:
        if CheckpointStore(target / "checkpoints", keep=1).latest() is not None:
            command = resume_command(target)
            click.echo(f"\nstopped at once; resume from the last checkpoint with: {command}", err=True)
        else:
            click.echo("\nstopped before the first checkpoint; nothing to resume", err=True)
        sys.exit(130)


@main.command()
@_config_options
@click.option("--memory", is_flag=True, help="Also estimate the memory per sub-batch size, to choose subdivisions.")
def check(
    config_path: str,
    subdivisions: str | None,
    no_subdivisions: bool,
    epochs: int | None,
    batch_size: str | None,
    assignments: tuple[str, ...],
    memory: bool,
) -> None:
    """Validate CONFIG and print it resolved, with the derived batch sizes."""
    from accumrun.config.loading import load_config

    overrides = _overrides(assignments, subdivisions, no_subdivisions, epochs, batch_size)
    config = load_config(config_path, overrides)
    _start_tensorflow()
    from accumrun.training.console import describe_setup
    from accumrun.training.setup import build_training

    setup = build_training(config)
    click.echo(setup.config.to_yaml().rstrip())
    click.echo("---")
    click.echo("\n".join(describe_setup(setup)))
    if memory:
        from accumrun.core.split import sub_batch_sizes
        from accumrun.reports.memory import estimate_memory, format_estimate

        configured = config.training.fixed_subdivisions
        traced = max(sub_batch_sizes(setup.batch_size, configured or 1))
        estimate = estimate_memory(
            setup.model,
            setup.optimizer,
            tuple(setup.model.input_shape[1:]),
            setup.batch_size,
            traced,
            sample_bytes=setup.dataset.dtype.itemsize,
            feed=setup.feed,
        )
        click.echo("\n".join(format_estimate(estimate, setup.batch_size, configured)))


def _subdivision_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int | str] | None:
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or not all(part == "auto" or (part.isdigit() and int(part) >= 1) for part in parts):
        raise click.BadParameter(f"{value!r} is not a comma-separated list of positive integers or 'auto', e.g. 8,1")
    return list(dict.fromkeys(part if part == "auto" else int(part) for part in parts))


def _resolve_run_dir(template: str, config_path: str) -> Path:
    from accumrun.rundir.layout import resolve_run_dir

    return resolve_run_dir(template, Path(config_path).stem)


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option(
    "--subdivisions",
    "subdivision_counts",
    callback=_subdivision_list,
    metavar="LIST",
    help="Comma-separated subdivision counts to train, e.g. 8,4,1 or auto,1 [default: the config's, and 1].",
)
@click.option("--epochs", type=click.IntRange(min=1), help="Override training.epochs.")
@click.option("--batch-size", type=_PositiveOr("full"), help="Override training.batch_size (N or 'full').")
@_SET_OPTION
@click.option("--run-dir", type=click.Path(file_okay=False), help="Folder for the variants and the report.")
def compare(
    config_path: str,
    subdivision_counts: list[int | str] | None,
    epochs: int | None,
    batch_size: str | None,
    assignments: tuple[str, ...],
    run_dir: str | None,
) -> None:
    """Train CONFIG with subdivisions on and off, from the same weights and data order, and compare.

    Each variant is a run folder of its own under the compare folder, with its TensorBoard scalars, so
    `tensorboard --logdir COMPARE_DIR` overlays them.
    """
    overrides = _overrides(assignments, None, False, epochs, batch_size)
    _start_tensorflow()
    comparison = accumrun.compare(config_path, subdivision_counts, run_dir, overrides=overrides)
    click.echo("")
    click.echo(comparison.table())
    png = f" and {comparison.png_path}" if comparison.png_path else ""
    click.echo(f"\nwrote {comparison.json_path}{png}")
    if comparison.failed:
        count = len(comparison.variants)
        raise click.ClickException(f"{len(comparison.failed)} of {count} variants failed; see the table above")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--workers", type=click.IntRange(min=1), required=True, help="How many local workers to start.")
@click.argument("train_args", metavar="[CONFIG] [TRAIN OPTIONS]...", nargs=-1, type=click.UNPROCESSED)
def launch(workers: int, train_args: tuple[str, ...]) -> None:
    """Start WORKERS local processes of one multi-worker run: `accumrun train` with the same CONFIG and train
    options (--resume RUN_DIR among them), TF_CONFIG on free localhost ports, output prefixed [w0], [w1], ...

    Ctrl-C and SIGTERM are passed on to every worker, which stop at the same batch after a checkpoint. The
    launcher exits with worker 0's status.
    """
    from accumrun.launcher import launch as launch_workers
    from accumrun.launcher import resume_hint
    from accumrun.rundir.status import read_status

    args = list(train_args)
    run_dir, new_run, timeout = _launched_run_dir(args)
    if new_run:
        args += ["--run-dir", str(run_dir)]
    args += ["--set", "distribute.strategy=multi_worker"]
    code = launch_workers(workers, args, click.echo, grace_seconds=timeout + 30)
    if code != 0 and (run_dir / "checkpoints").is_dir() and read_status(run_dir) != "completed":
        click.echo(f"[launch] resume with: {resume_hint(workers, run_dir)}", err=True)
    sys.exit(code)


def _launched_run_dir(args: list[str]) -> tuple[Path, bool, int]:
    """The run directory that a launch's train options name (--resume, --run-dir), or the config's
    ``output.run_dir``, resolved once for every worker; whether it is a new run's to pass on as --run-dir; and
    the run's ``distribute.timeout_seconds``."""
    from accumrun.config.loading import load_config, load_resume_config

    # The train options that take a value, to tell CONFIG from an option's value.
    takes_value = {
        name for param in train.params if isinstance(param, click.Option) and not param.is_flag for name in param.opts
    }
    values: dict[str, list[str]] = {}
    positionals = []
    index = 0
    while index < len(args):
        arg = args[index]
        name, equals, value = arg.partition("=")
        if name in takes_value and equals:
            values.setdefault(name, []).append(value)
        elif arg in takes_value and index + 1 < len(args):
            values.setdefault(arg, []).append(args[index + 1])
            index += 1
        elif not arg.startswith("-"):
            positionals.append(arg)
        index += 1
    overrides = values.get("--set", [])
    if "--resume" in values:
        resumed = Path(values["--resume"][-1])
        config = load_resume_config(resumed, positionals[0] if positionals else None, overrides)
        return resumed, False, config.distribute.timeout_seconds
    if not positionals:
        raise click.UsageError("missing CONFIG (or --resume RUN_DIR to continue a run)")
    config = load_config(positionals[0], overrides)
    timeout = config.distribute.timeout_seconds
    if "--run-dir" in values:
        return Path(values["--run-dir"][-1]), False, timeout
    return _resolve_run_dir(config.output.run_dir, positionals[0]), True, timeout


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--split", type=click.Choice(["val", "test", "train"]), default="val", show_default=True, help="What to score."
)
@click.option("--data", "data_path", metavar="PATH", help="Score all of this source (of the run's kind) instead.")
@click.option("--model", "which", type=click.Choice(["final", "best"]), default="final", show_default=True)
def evaluate(run_dir: Path, split: str, data_path: str | None, which: str) -> None:
    """Score a finished run's model with its loss and metrics; write RUN_DIR/eval-<split>.json."""
    _start_tensorflow()
    from accumrun.reports.evaluate import describe

    # click.Choice has checked split and which; the API's Literal types cannot see that.
    result = accumrun.evaluate(run_dir, split, data=data_path, model=which)  # type: ignore[arg-type]
    click.echo(describe(result))


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("inputs", metavar="INPUT...", nargs=-1, required=True)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write a .csv or .json file.")
@click.option("--top-k", type=click.IntRange(min=1), help="Classes per row [default: up to 5].")
@click.option("--model", "which", type=click.Choice(["final", "best"]), default="final", show_default=True)
def predict(run_dir: Path, inputs: tuple[str, ...], output: Path | None, top_k: int | None, which: str) -> None:
    """Label new inputs with a finished run's model: image files or folders, an .npz with x, or a CSV.

    Prints a table, or writes one row per input to --output (CSV, or JSON for a .json name).
    """
    _start_tensorflow()
    predictions = accumrun.predict(run_dir, inputs, top_k=top_k, model=which, show_progress=True)  # type: ignore[arg-type]
    if output is None:
        click.echo(predictions.table())
    else:
        click.echo(f"wrote {len(predictions.rows):,} predictions to {predictions.write(output)}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--format", "format_", type=click.Choice(["savedmodel"]), default="savedmodel", show_default=True)
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), help="[default: RUN_DIR/export/savedmodel]")
@click.option("--overwrite", is_flag=True, help="Replace what is at the output.")
@click.option("--model", "which", type=click.Choice(["final", "best"]), default="final", show_default=True)
def export(run_dir: Path, format_: str, output: Path | None, overwrite: bool, which: str) -> None:
    """Export a finished run's model as a TensorFlow SavedModel whose serving signature takes raw samples and
    returns probabilities (and, for classification, class_index and class_name)."""
    _start_tensorflow()
    exported = accumrun.export(run_dir, output, overwrite=overwrite, model=which)  # type: ignore[arg-type]
    click.echo(exported.describe())


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default="plot.png", show_default=True, help="PNG to write.")
def plot(run_dirs: tuple[str, ...], out: str) -> None:
    """Plot the training and validation loss of one or more run directories together."""
    from accumrun.reports.plot import plot_curves
    from accumrun.rundir.metrics import load_metrics

    curves = {Path(run_dir).name or run_dir: load_metrics(Path(run_dir)) for run_dir in run_dirs}
    click.echo(f"wrote {plot_curves(curves, Path(out))}")


@main.command()
@click.argument("dataset", type=click.Choice(DOWNLOADABLE))
@click.option("--to", "folder", type=click.Path(file_okay=False), help="Folder for the files [default: datasets/NAME].")
@click.option(
    "--base-url", help="Fetch from this mirror (a URL or a local http server) instead of the official source."
)
def download(dataset: str, folder: str | None, base_url: str | None) -> None:
    """Download the four IDX files of DATASET, verify their checksums and write them atomically."""
    from accumrun.data.download import download_dataset
    from accumrun.data.sources import DATASETS_DIR

    target = Path(folder) if folder else DATASETS_DIR / dataset
    download_dataset(dataset, target, base_url=base_url, echo=click.echo)
    click.echo(f"{dataset} is ready in {target}")


@main.command("make-example")
@click.argument("kind", type=click.Choice(["images", "tfrecord", "csv"]))
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--count", type=click.IntRange(min=6), default=600, show_default=True, help="Images or rows to make.")
@click.option("--size", type=click.IntRange(min=4), default=32, show_default=True, help="Image side in pixels.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def make_example(kind: str, target: Path, count: int, size: int, seed: int) -> None:
    """Make example data in TARGET: an image folder (images), TFRecord files named TARGET-0000i-of-00002
    (tfrecord), or a CSV table (csv). Nothing is downloaded."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        from accumrun.errors import DataError

        raise DataError(str(target), "already exists; choose another target or remove it")
    _start_tensorflow()
    from accumrun.data.examples import write_csv, write_image_folder, write_tfrecords

    if kind == "images":
        write_image_folder(target, count, size, seed)
    elif kind == "tfrecord":
        write_tfrecords(target, count, size, seed)
    else:
        write_csv(target, count, seed=seed)
    click.echo(f"wrote {count:,} {'rows' if kind == 'csv' else 'images'} to {target}")
