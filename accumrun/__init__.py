"""accumrun: a TensorFlow training runner with exact darknet-style gradient accumulation.

The Python API. ``import accumrun`` stays light: TensorFlow is imported on the first call that needs it.

    >>> config = accumrun.load_config("configs/digits.yaml", ["training.epochs=2"])
    >>> result = accumrun.train(config, "runs/digits-notebook", quiet=True)
    >>> result.metrics[-1]["val_accuracy"]
    >>> accumrun.evaluate(result.run_dir)["accuracy"]
    >>> accumrun.predict(result.run_dir, ["new.npz"]).records()[0]["prediction"]
    >>> accumrun.generate("runs/char_lm", "Alice was").text  # a language model's run

The functions on a finished run take ``model``: ``final`` (``model.keras``) or ``best`` (``model.best.keras``, kept
with ``output.keep_best``); another word raises ArgumentError.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import tensorflow as tf

    from accumrun.config.schema import Config
    from accumrun.reports.compare import Comparison
    from accumrun.reports.export import Exported
    from accumrun.reports.generate import Generated
    from accumrun.reports.predict import Predictions
    from accumrun.training.runner import RunResult

from accumrun._version import __version__
from accumrun.kinds import Kind, ModelFile, Split

__all__ = [
    "__version__",
    "compare",
    "evaluate",
    "export",
    "generate",
    "load_config",
    "predict",
    "resume_compare",
    "train",
]

K = TypeVar("K", bound=Kind)


def load_config(source: str | Path | dict[str, Any], overrides: Sequence[str] = ()) -> Config:
    """Read and validate a config: a YAML file or a mapping of sections, then ``key.path=value`` overrides.

    Raises:
        ConfigError: anything in it is invalid; every problem is listed in one error.
    """
    from accumrun.config.loading import load_config as load

    return load(source, overrides)


def train(
    config: Config | str | Path | dict[str, Any],
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    strategy: tf.distribute.Strategy | None = None,
) -> RunResult:
    """Train as ``config`` says (a loaded config, a YAML file or a mapping) into ``run_dir`` (by default the
    config's ``output.run_dir``); return the run directory, its per-epoch metrics rows and the trained model.

    ``resume`` continues the run in ``run_dir`` from its latest checkpoint; ``overwrite`` replaces a run there. The
    ``strategy`` is by default the one ``distribute`` asks for, created here (before TensorFlow creates its devices).

    Raises:
        ConfigError, DataError: the config or the data is refused; nothing was written.
        Interrupted: SIGINT or SIGTERM stopped the run after a checkpoint (its ``exit_code`` is the CLI's).
        TrainingDiverged: the loss or a gradient became NaN or Inf.
        WorkerLost: a worker of a multi-worker run stopped answering; the last checkpoint is intact.
    """
    from accumrun.config.schema import Config
    from accumrun.rundir.layout import resolve_run_dir
    from accumrun.training.distribute import create_strategy
    from accumrun.training.runner import train_run

    name = Path(config).stem if isinstance(config, str | Path) else "run"
    if not isinstance(config, Config):
        config = load_config(config)
    target = Path(run_dir) if run_dir is not None else resolve_run_dir(config.output.run_dir, name)
    if strategy is None:
        strategy = create_strategy(config.distribute)
    return train_run(config, target, strategy=strategy, quiet=quiet, resume=resume, overwrite=overwrite)


def evaluate(
    run_dir: str | Path,
    split: Split | str = Split.VAL,
    *,
    data: str | Path | None = None,
    model: ModelFile | str = ModelFile.FINAL,
) -> dict[str, Any]:
    """Score a finished run's model with its own loss and metrics on ``split`` (``val``, the run's validation data;
    ``test``, the source's test split; or ``train``), or on all of the source ``data`` (a file or folder of the
    run's kind, its labels read as the run's classes) as split ``data``. Return ``loss``, each metric under its
    name, ``samples``, ``model`` and ``split``, as written to ``run_dir/eval-<split>.json``.

    Raises:
        ArgumentError: ``split`` or ``model`` is none of its words.
        ConfigError: not a finished run, no such model or split.
        DataError: the data cannot be read, or ``data`` holds a label the run was not trained on.
    """
    from accumrun.reports.evaluate import evaluate_run

    data_path = str(data) if data is not None else None
    return evaluate_run(Path(run_dir), _member(Split, "split", split), data_path, _member(ModelFile, "model", model))


def predict(
    run_dir: str | Path,
    inputs: Sequence[str | Path],
    *,
    top_k: int | None = None,
    model: ModelFile | str = ModelFile.FINAL,
    show_progress: bool = False,
    lines: bool = False,
) -> Predictions:
    """Predict new inputs with a finished run's model: one row per sample.

    The ``inputs`` are raw samples, as the run's source stores them: image files or folders of them (image runs),
    ``.npz`` files with ``x``, CSV tables with the run's feature columns (CSV runs), or ``.txt`` files or folders of
    them (text runs); with ``lines``, each line of a ``.txt`` file is one input, named ``PATH:LINE`` (blank lines
    skipped). A run on a text table also takes files laid out as its own (``.csv`` or ``.jsonl``, the label not
    needed), a row each, named by ``data.id`` where the run has one. ``top_k`` is the classes per row for
    classification, by default ``min(5, classes)``;
    ``show_progress`` draws a progress bar on standard error (on a terminal, over more than one batch).

    Returns:
        The table: ``columns`` and ``rows``; ``records()`` as dicts, ``write(path)`` to CSV or JSON, ``table()`` as
        text. Columns: ``input, prediction, top1_class, top1_prob, ...`` (classification), ``input, prediction,
        <one probability per class>`` (multi-label) or ``input, value_0, ...``.

    Raises:
        ConfigError: not a finished run, no such model, ``top_k`` out of range, ``lines`` for a run not on text.
        DataError: an input is missing, unreadable, of the wrong kind, shape or columns.
    """
    from accumrun.reports.predict import predict_run

    paths = [str(path) for path in inputs]
    which = _member(ModelFile, "model", model)
    return predict_run(Path(run_dir), paths, top_k=top_k, which=which, show_progress=show_progress, lines=lines)


def generate(
    run_dir: str | Path,
    prompt: str,
    *,
    max_tokens: int = 200,
    temperature: float = 0.0,
    seed: int = 0,
    model: ModelFile | str = ModelFile.FINAL,
    on_text: Callable[[str], None] | None = None,
) -> Generated:
    """Continue ``prompt`` (tokenized as the run's corpus was) by ``max_tokens`` tokens with a finished language
    model's run (``task: causal_lm``); return ``prompt``, ``continuation``, ``text`` (both) and ``tokens``.

    ``temperature`` 0 picks the most likely token (greedy); above 0, a token is drawn from the softmax of the logits
    divided by it, seeded by ``seed`` and the token's place in the text, so that the same call gives the same text.
    ``on_text``, when given, is called with the prompt once the model is loaded, then with each piece of the
    continuation as soon as its text is complete (a character whose bytes are several tokens comes whole): the
    pieces make up ``text``. A KeyboardInterrupt stops generation there.

    Raises:
        ArgumentError: an empty prompt, a negative ``max_tokens`` or ``temperature``, or ``model`` none of its
            words.
        ConfigError: not a finished run or not a language model, or a prompt that holds no token.
    """
    from accumrun.reports.generate import generate_text

    which = _member(ModelFile, "model", model)
    return generate_text(
        Path(run_dir), prompt, max_tokens=max_tokens, temperature=temperature, seed=seed, which=which, on_text=on_text
    )


def export(
    run_dir: str | Path,
    output: str | Path | None = None,
    *,
    overwrite: bool = False,
    model: ModelFile | str = ModelFile.FINAL,
) -> Exported:
    """Export a finished run's model as a TensorFlow SavedModel in ``output`` (by default
    ``run_dir/export/savedmodel``; ``overwrite`` replaces it) with a ``serving_default`` signature on raw samples
    that returns ``probabilities``, ``class_index`` and ``class_name`` (classification), ``probabilities``
    (multi-label) or ``values`` (regression).

    Raises:
        ConfigError: not a finished run, no such model, or ``output`` exists without ``overwrite``.
    """
    from accumrun.reports.export import export_run

    target = Path(output) if output is not None else None
    return export_run(Path(run_dir), target, overwrite=overwrite, which=_member(ModelFile, "model", model))


def compare(
    config: str | Path,
    subdivisions: Sequence[int | str] | None = None,
    run_dir: str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    quiet: bool = False,
    vary: tuple[str, Sequence[str]] | None = None,
) -> Comparison:
    """Train the config at ``config`` once per subdivision count, or once per value of another key (each in its own
    process, from the same seed and data order) and compare the curves, the speed, the memory and the final weights.

    The ``subdivisions`` (``auto`` among them) are by default the config's and 1; ``vary``, ``(key.path, values)``,
    varies another key instead (``("optimizer.name", ["adam", "sgd"])``), each value as ``--set`` takes it;
    ``run_dir``, new or empty, gets the variants and ``compare.json``/``compare.png``; ``overrides``
    (``key.path=value``) apply to every variant; without ``quiet``, each variant's progress goes to standard output.
    The result holds the variants (status, metrics rows, largest weight difference to the first where the models
    match) and the report's paths; ``table()`` is what the command prints.

    Raises:
        ConfigError: the config, or a variant's config or optimizer (checked before any trains), is invalid, or
            ``run_dir`` holds files.
        ArgumentError: ``subdivisions`` left to the config when it trains with 1, or both ``subdivisions`` and
            ``vary``.
        Interrupted: SIGINT or SIGTERM stopped it; ``run_dir/compare.json`` says where each variant stands, and
            :func:`resume_compare` goes on.
    """
    from accumrun.errors import ArgumentError
    from accumrun.optim.optimizers import build_optimizer
    from accumrun.reports.compare import SUBDIVISIONS, compare_runs
    from accumrun.rundir.layout import resolve_run_dir

    path = Path(config)
    loaded = load_config(path, overrides)
    template = "runs/compare-{config_name}-{timestamp}"
    target = Path(run_dir) if run_dir is not None else resolve_run_dir(template, path.stem)
    # Flushed, so that each line comes before the output of the variant's process that follows it.
    echo = (lambda _: None) if quiet else functools.partial(print, flush=True)
    if vary is not None and subdivisions is not None:
        raise ArgumentError("vary", "compares one key; vary subdivisions or another key, not both")
    key, values = vary if vary is not None else (SUBDIVISIONS, subdivisions)
    if values is None:
        if loaded.training.subdivisions == 1:
            raise ArgumentError(
                "subdivisions", "the config trains with subdivisions 1; name the counts to compare, e.g. 8,1"
            )
        values = [loaded.training.subdivisions, 1]
    for value in values:  # every variant's config and optimizer are checked before the first one trains
        build_optimizer(load_config(path, [*overrides, f"{key}={value}"]).optimizer)
    return compare_runs(path, list(values), target, list(overrides), echo=echo, key=key)


def resume_compare(run_dir: str | Path, *, quiet: bool = False) -> Comparison:
    """Go on with the comparison in ``run_dir`` that SIGINT or SIGTERM stopped: resume its stopped variant from its
    checkpoint, train those not started, and return what an uninterrupted :func:`compare` returns (the same rows
    and weights).

    Raises:
        ConfigError: ``run_dir`` holds no comparison, or every variant of it has run.
        Interrupted: stopped again.
    """
    from accumrun.reports.compare import resume_comparison

    echo = (lambda _: None) if quiet else functools.partial(print, flush=True)
    return resume_comparison(Path(run_dir), echo=echo)


def _member(kind: type[K], argument: str, value: K | str) -> K:
    """``value`` as a member of ``kind``: a member already, or its word; else an ArgumentError."""
    from accumrun.errors import ArgumentError

    try:
        return kind(value)
    except ValueError:
        raise ArgumentError(argument, f"must be one of {', '.join(kind.words())}", value) from None
