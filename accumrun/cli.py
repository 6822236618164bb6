"""The command line: parse, load the config, call the Python API, map failures to exit codes.

TensorFlow is imported inside the command bodies only, so ``accumrun --help`` answers at once.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import sys
import threading
import traceback
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

import accumrun
from accumrun._version import __version__
from accumrun.data.sources import DOWNLOADABLE
from accumrun.errors import ArgumentError, DataError
from accumrun.kinds import ModelFile, Split

if TYPE_CHECKING:
    import tensorflow as tf

    from accumrun.config.schema import Config, DistributeConfig

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


class _RunFolder(click.ParamType):
    """A run's folder, which holds its ``run.json``; anything else is a usage error, worded alike for every command."""

    name = "run_dir"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        from accumrun.rundir.layout import require_run_folder

        try:
            return require_run_folder(Path(value))
        except ArgumentError as error:
            raise click.UsageError(error.message, ctx) from None


_RUN_FOLDER = _RunFolder()


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


_ASSIGNMENT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*=")


def _assignments(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--set`` values must read KEY=VALUE with a dotted key; anything else is a usage error."""
    for value in values:
        if not _ASSIGNMENT.match(value):
            raise click.BadParameter(
                f"{value!r} is not KEY=VALUE with a dotted key, e.g. training.subdivisions=4", ctx, param
            )
    return values


class _Command(click.Command):
    """Shows a bad argument of the API call (:class:`~accumrun.errors.ArgumentError`) as a usage error."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ArgumentError as error:
            raise click.UsageError(error.message, ctx) from None


class _ClosedStdoutIgnored:
    """``sys.stdout`` for a command whose reader may go away (``accumrun train ... | head -4``): once the pipe is
    closed, the output goes to the null device and the command carries on, as its run folder is what counts."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._to_null_device()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_null_device()

    def _to_null_device(self) -> None:
        # Python's advice (the signal module's notes on SIGPIPE): this buffer and every later one go to os.devnull.
        self.reader_gone = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Group(click.Group):
    """Turns an unexpected exception into a one-line error instead of a traceback; a closed stdout ends nothing."""

    command_class = _Command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with contextlib.redirect_stdout(_ClosedStdoutIgnored(sys.stdout)):
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


def _options(options: Sequence[Callable[[Any], Any]]) -> Callable[[F], F]:
    """Apply a list of click arguments and options to a command, in the order they are listed."""
    return lambda command: functools.reduce(lambda decorated, option: option(decorated), reversed(options), command)


# The overrides that compare takes too, beside its own --subdivisions.
_SHARED_OVERRIDE_OPTIONS = [
    click.option("--epochs", type=click.IntRange(min=1), help="Override training.epochs."),
    click.option("--batch-size", type=_PositiveOr("full"), help="Override training.batch_size (N or 'full')."),
    click.option(
        "--set",
        "assignments",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_assignments,
        help="Override any key, e.g. --set optimizer.learning_rate=0.01 (repeatable).",
    ),
]

# The options of the commands that read a config: all of them are overrides of its keys.
_OVERRIDE_OPTIONS = [
    click.option("--subdivisions", type=_PositiveOr("auto"), help="Override training.subdivisions (N or 'auto')."),
    click.option("--no-subdivisions", is_flag=True, help="Train with subdivisions: 1 (plain training)."),
    *_SHARED_OVERRIDE_OPTIONS,
]

# train's argument and options, declared once: `launch` takes the same and passes them on to every worker.
_TRAIN_OPTIONS = [
    click.argument("config_path", metavar="CONFIG", required=False, type=click.Path(dir_okay=False)),
    *_OVERRIDE_OPTIONS,
    click.option("--run-dir", type=click.Path(file_okay=False), help="Write the run here instead of output.run_dir."),
    click.option(
        "--resume",
        "resume_dir",
        metavar="RUN_DIR",
        type=_RUN_FOLDER,
        help="Continue the run in RUN_DIR from its latest checkpoint (CONFIG is optional; --epochs may extend it).",
    ),
    click.option("--overwrite", is_flag=True, help="Replace the run already in the run directory."),
    click.option("--no-tensorboard", is_flag=True, help="Do not write TensorBoard scalars (output.tensorboard)."),
    click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors."),
]

_MODEL_OPTION = click.option(
    "--model",
    type=click.Choice(ModelFile.words()),
    default=ModelFile.FINAL.value,
    show_default=True,
    help="final (model.keras) or best (model.best.keras, kept with output.keep_best).",
)


def _overrides(
    assignments: tuple[str, ...],
    subdivisions: str | None = None,
    no_subdivisions: bool = False,
    epochs: int | None = None,
    batch_size: str | None = None,
) -> list[str]:
    """The ``--set`` assignments, then the dedicated flags (which win, being more specific)."""
    if no_subdivisions and subdivisions is not None:
        raise click.UsageError("--subdivisions and --no-subdivisions exclude each other")
    flags = {"subdivisions": "1" if no_subdivisions else subdivisions, "epochs": epochs, "batch_size": batch_size}
    return [*assignments, *(f"training.{key}={value}" for key, value in flags.items() if value is not None)]


@dataclass(frozen=True)
class _TrainOptions:
    """What train's argument and options ask for, as click parsed them."""

    config_path: str | None
    subdivisions: str | None
    no_subdivisions: bool
    epochs: int | None
    batch_size: str | None
    assignments: tuple[str, ...]
    run_dir: str | None
    resume_dir: Path | None
    overwrite: bool
    no_tensorboard: bool
    quiet: bool

    def resolve(self) -> tuple[Config, Path]:
        """The config to train and its run directory: CONFIG with the overrides, in --run-dir or its
        ``output.run_dir`` resolved now, or the resumed run's own config (CONFIG checked against it) and folder."""
        from accumrun.config.loading import load_config, load_resume_config
        from accumrun.rundir.layout import resolve_run_dir

        if self.resume_dir is None and self.config_path is None:
            raise click.UsageError("missing CONFIG (or --resume RUN_DIR to continue a run)")
        if self.resume_dir is not None and (self.run_dir or self.overwrite):
            raise click.UsageError("--resume continues the run in its own directory; drop --run-dir and --overwrite")
        overrides = _overrides(self.assignments, self.subdivisions, self.no_subdivisions, self.epochs, self.batch_size)
        if self.no_tensorboard:
            overrides.append("output.tensorboard=false")
        if self.resume_dir is not None:
            return load_resume_config(self.resume_dir, self.config_path, overrides), self.resume_dir
        assert self.config_path is not None  # checked above
        config = load_config(self.config_path, overrides)
        if self.run_dir:
            return config, Path(self.run_dir)
        return config, resolve_run_dir(config.output.run_dir, Path(self.config_path).stem)


def _start_tensorflow(distribute: DistributeConfig | None = None) -> tf.distribute.Strategy | None:
    """Import TensorFlow and create its devices with file descriptor 2 hidden (native code prints CUDA probing and
    CPU-feature notes there before logging is set up); return the strategy ``distribute`` asks for, created first,
    as logical CPUs and the multi-worker runtime can only be set up before TensorFlow creates its devices."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved_stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow as tf

        from accumrun.training.distribute import create_strategy

        strategy = create_strategy(distribute) if distribute is not None else None
        tf.config.list_logical_devices()
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        os.close(devnull)
    return strategy


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="accumrun")
def main() -> None:
    """Train TensorFlow models with exact darknet-style gradient accumulation (subdivisions)."""


def run() -> None:
    """The ``accumrun`` command: :func:`main`, then, once TensorFlow is loaded, an exit that skips the interpreter's
    teardown. Tearing TensorFlow down takes 2 to 3 s after everything is written (measured on a 2-core CPU, for any
    Keras script): a user would wait it out after every run. The exit handlers still run first (they flush the logs
    and end a multi-worker run's service), other threads are waited for, and the output is flushed."""
    try:
        main(prog_name="accumrun")
    except SystemExit as done:
        if "tensorflow" not in sys.modules:
            raise
        code = done.code
    else:
        code = 0
    if not isinstance(code, int):  # sys.exit("message") or sys.exit(None), as the interpreter reads them
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more can be written
            stream.flush()
    os._exit(code)


@main.command()
@_options(_TRAIN_OPTIONS)
def train(**options: Any) -> None:
    """Train the model that CONFIG describes, or continue a stopped run with --resume RUN_DIR.

    Ctrl-C or SIGTERM stops at the end of the current batch, saves a checkpoint and prints the command that
    resumes the run; a second Ctrl-C stops at once.
    """
    request = _TrainOptions(**options)
    config, target = request.resolve()
    # Before anything imports TensorFlow, so that its start-up chatter is hidden.
    strategy = _start_tensorflow(config.distribute)
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


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@_options(_OVERRIDE_OPTIONS)
@click.option("--memory", is_flag=True, help="Also estimate the memory per sub-batch size, to choose subdivisions.")
def check(config_path: str, memory: bool, **overrides: Any) -> None:
    """Validate CONFIG and print it resolved, with the derived batch sizes."""
    from accumrun.config.loading import load_config

    config = load_config(config_path, _overrides(**overrides))
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
        click.echo("\n".join(format_estimate(estimate, configured)))


def _subdivision_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int | str] | None:
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or not all(part == "auto" or (part.isdigit() and int(part) >= 1) for part in parts):
        raise click.BadParameter(f"{value!r} is not a comma-separated list of positive integers or 'auto', e.g. 8,1")
    return list(dict.fromkeys(part if part == "auto" else int(part) for part in parts))


def _varied_key(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, list[str]] | None:
    if value is None:
        return None
    key, _, listed = value.partition("=")
    values = [part.strip() for part in listed.split(",") if part.strip()]
    if not key.strip() or len(values) < 2:
        raise click.BadParameter(f"{value!r} is not KEY=VALUE,VALUE[,...], e.g. optimizer.name=adam,sgd")
    return key.strip(), list(dict.fromkeys(values))


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option(
    "--subdivisions",
    callback=_subdivision_list,
    metavar="LIST",
    help="Comma-separated subdivision counts to train, e.g. 8,4,1 or auto,1 [default: the config's, and 1].",
)
@click.option(
    "--vary",
    callback=_varied_key,
    metavar="KEY=V1,V2",
    help="Compare values of another config key instead, e.g. optimizer.name=adam,sgd.",
)
@_options(_SHARED_OVERRIDE_OPTIONS)
@click.option("--run-dir", type=click.Path(file_okay=False), help="Folder for the variants and the report.")
def compare(
    config_path: str,
    subdivisions: list[int | str] | None,
    vary: tuple[str, list[str]] | None,
    run_dir: str | None,
    **overrides: Any,
) -> None:
    """Train CONFIG with subdivisions on and off (or with each value of the --vary key), from the same weights and
    data order, and compare.

    Each variant is a run folder of its own under the compare folder, with its TensorBoard scalars, so
    `tensorboard --logdir COMPARE_DIR` overlays them.
    """
    if vary is not None and subdivisions is not None:
        raise click.UsageError("--vary and --subdivisions each choose what to compare; give one")
    _start_tensorflow()
    comparison = accumrun.compare(config_path, subdivisions, run_dir, overrides=_overrides(**overrides), vary=vary)
    click.echo(f"\n{comparison.table()}")
    png = f" and {comparison.png_path}" if comparison.png_path else ""
    click.echo(f"\nwrote {comparison.json_path}{png}")
    if comparison.failed:
        count = len(comparison.variants)
        raise click.ClickException(f"{len(comparison.failed)} of {count} variants failed; see the table above")


@main.command()
@click.option("--workers", type=click.IntRange(min=1), required=True, help="How many local workers to start.")
@_options(_TRAIN_OPTIONS)
@click.pass_context
def launch(ctx: click.Context, workers: int, **options: Any) -> None:
    """Start WORKERS local processes of one multi-worker run: `accumrun train` with the same CONFIG and train
    options (--resume RUN_DIR among them), TF_CONFIG on free localhost ports, output prefixed [w0], [w1], ...

    Ctrl-C and SIGTERM are passed on to every worker, which stop at the same batch after a checkpoint. The
    launcher exits with worker 0's status, or 75 if worker 0 is lost.
    """
    from accumrun.launcher import launch as launch_workers
    from accumrun.launcher import resume_hint

    request = _TrainOptions(**options)
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


@main.command()
@click.argument("run_dir", type=_RUN_FOLDER)
@click.option(
    "--split", type=click.Choice(Split.words()), default=Split.VAL.value, show_default=True, help="What to score."
)
@click.option("--data", "data_path", metavar="PATH", help="Score all of this source (of the run's kind) instead.")
@_MODEL_OPTION
def evaluate(run_dir: Path, split: str, data_path: str | None, model: str) -> None:
    """Score a finished run's model with its loss and metrics; write RUN_DIR/eval-<split>.json."""
    _start_tensorflow()
    from accumrun.reports.evaluate import describe

    click.echo(describe(accumrun.evaluate(run_dir, split, data=data_path, model=model)))


@main.command()
@click.argument("run_dir", type=_RUN_FOLDER)
@click.argument("inputs", metavar="INPUT...", nargs=-1, required=True)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write a .csv or .json file.")
@click.option("--top-k", type=click.IntRange(min=1), help="Classes per row [default: up to 5].")
@click.option("--lines", is_flag=True, help="Text runs: each line of a .txt file is one input.")
@_MODEL_OPTION
def predict(run_dir: Path, inputs: tuple[str, ...], output: Path | None, **options: Any) -> None:
    """Label new inputs with a finished run's model: image files or folders, an .npz with x, a CSV, or .txt files.

    Prints a table, or writes one row per input to --output (CSV, or JSON for a .json name).
    """
    _start_tensorflow()
    predictions = accumrun.predict(run_dir, inputs, show_progress=True, **options)
    if output is None:
        click.echo(predictions.table())
    else:
        count = len(predictions.rows)
        click.echo(f"wrote {count:,} prediction{'' if count == 1 else 's'} to {predictions.write(output)}")


@main.command()
@click.argument("run_dir", type=_RUN_FOLDER)
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
@_MODEL_OPTION
def generate(run_dir: Path, prompt: str, **options: Any) -> None:
    """Continue --prompt with a finished language model's run (data.task: causal_lm); print the prompt, then the
    text as the model writes it.

    Any --max-tokens runs: Ctrl-C stops it, keeping what was printed (exit 130).
    """
    try:
        _start_tensorflow()
        accumrun.generate(run_dir, prompt, on_text=_show_piece, **options)
    except KeyboardInterrupt:
        # Not click's "Aborted!" and exit 1: the text so far is the output, kept as training keeps its checkpoint.
        click.echo("\nstopped by Ctrl-C", err=True)
        sys.exit(130)
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


@main.command()
@click.argument("run_dir", type=_RUN_FOLDER)
@click.option("--format", "format_", type=click.Choice(["savedmodel"]), default="savedmodel", show_default=True)
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), help="[default: RUN_DIR/export/savedmodel]")
@click.option("--overwrite", is_flag=True, help="Replace what is at the output.")
@_MODEL_OPTION
def export(run_dir: Path, format_: str, output: Path | None, overwrite: bool, model: str) -> None:
    """Export a finished run's model as a TensorFlow SavedModel whose serving signature takes raw samples and
    returns probabilities (and, for classification, class_index and class_name)."""
    _start_tensorflow()
    click.echo(accumrun.export(run_dir, output, overwrite=overwrite, model=model).describe())


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=_PlottedFolder())
@click.option("--out", type=click.Path(dir_okay=False), default="plot.png", show_default=True, help="PNG to write.")
def plot(run_dirs: tuple[Path, ...], out: str) -> None:
    """Plot the training and validation loss of one or more run directories together; a comparison's folder
    (accumrun compare) draws each of its variants."""
    from accumrun.reports.compare import compared_curves
    from accumrun.reports.plot import plot_curves
    from accumrun.rundir.metrics import load_metrics

    curves = {}
    for folder in run_dirs:
        name = folder.name or str(folder)
        if (folder / "compare.json").is_file():
            prefix = f"{name}: " if len(run_dirs) > 1 else ""
            curves.update({prefix + variant: rows for variant, rows in compared_curves(folder).items()})
        else:
            curves[name] = load_metrics(folder)
    click.echo(f"wrote {plot_curves(curves, Path(out))}")


def _url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A URL that urllib can fetch from: one without a scheme is a usage error, whatever the mirror holds."""
    if value is not None and urllib.parse.urlsplit(value).scheme not in ("http", "https", "ftp", "file"):
        raise click.BadParameter(f"{value!r} is not an http://, https://, ftp:// or file:// URL", ctx, param)
    return value


@main.command()
@click.argument("dataset", type=click.Choice(DOWNLOADABLE))
@click.option("--to", "folder", type=click.Path(file_okay=False), help="Folder for the files [default: datasets/NAME].")
@click.option(
    "--base-url",
    callback=_url,
    help="Fetch from this mirror (a URL or a local http server) instead of the official source.",
)
def download(dataset: str, folder: str | None, base_url: str | None) -> None:
    """Download the four IDX files of DATASET, verify their checksums and write them atomically."""
    from accumrun.data.arrays import DATASETS_DIR
    from accumrun.data.download import download_dataset

    target = Path(folder) if folder else DATASETS_DIR / dataset
    download_dataset(dataset, target, base_url=base_url, echo=click.echo)
    click.echo(f"{dataset} is ready in {target}")


@main.command("make-example")
@click.argument("kind", type=click.Choice(["images", "tfrecord", "csv", "text", "corpus", "tokens", "random-labels"]))
@click.argument("target", type=click.Path(path_type=Path))
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
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise DataError(str(target), "already exists; choose another target or remove it")
    _start_tensorflow()
    from accumrun.data import examples

    if kind == "images":
        examples.write_image_folder(target, count, size, seed)
    elif kind == "tfrecord":
        shards = examples.write_tfrecords(target, count, size, seed)
        click.echo(f"wrote {count:,} images to {len(shards)} shards, {shards[0].name} to {shards[-1].name}")
        click.echo(f"train on them with data.path: {target}")
        return
    elif kind == "random-labels":
        from accumrun.data.arrays import DIGITS_FILE

        examples.write_random_labels(target, DIGITS_FILE, seed)
        click.echo(f"wrote the bundled digits with labels permuted at random (seed {seed}) to {target}")
        return
    elif kind == "text":
        examples.write_text_folder(target, count, seed)
    elif kind == "corpus":
        examples.write_corpus(target, count, seed)
    elif kind == "tokens":
        train, val = examples.write_tokens(target, count, seed)
        click.echo(f"wrote the bytes of {count:,} texts as uint16 token ids to {train} and {val}")
        click.echo(
            f"train on them with data: {{name: tokens, path: {train}, validation_path: {val}, vocabulary_size: 256}}"
        )
        return
    else:
        examples.write_csv(target, count, seed=seed)
    noun = {"csv": "rows", "text": "texts", "corpus": "text files"}.get(kind, "images")
    click.echo(f"wrote {count:,} {noun} to {target}")
