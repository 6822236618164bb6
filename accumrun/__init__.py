"""accumrun: a TensorFlow training runner with exact darknet-style gradient accumulation.

The Python API. ``import accumrun`` stays light: TensorFlow is imported on the first call that needs it.

    >>> config = accumrun.load_config("configs/digits.yaml", ["training.epochs=2"])
    >>> result = accumrun.train(config, "runs/digits-notebook", quiet=True)
    >>> result.metrics[-1]["val_accuracy"]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import tensorflow as tf

    from accumrun.config.schema import Config
    from accumrun.training.runner import RunResult

__version__ = "0.1.0"

__all__ = ["__version__", "evaluate", "load_config", "train"]


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
    """Train as ``config`` says (a loaded config, a YAML file or a mapping) and return the run's result.

    Args:
        config: What to train.
        run_dir: Where the run writes its files; ``output.run_dir`` of the config by default.
        resume: Continue the run in ``run_dir`` from its latest checkpoint.
        overwrite: Replace a run already in ``run_dir``.
        quiet: Print nothing.
        strategy: The ``tf.distribute`` strategy to train under; by default the one ``distribute`` asks for,
            created here (it must be created before TensorFlow creates its devices).

    Returns:
        The run directory, its per-epoch metrics rows and the trained model.

    Raises:
        ConfigError, DataError: the config or the data is refused; nothing was written.
        Interrupted: SIGINT or SIGTERM stopped the run after a checkpoint (its ``exit_code`` is the CLI's).
        TrainingDiverged: the loss or a gradient became NaN or Inf.
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
    split: Literal["val", "test", "train"] = "val",
    *,
    data: str | Path | None = None,
    model: Literal["final", "best"] = "final",
) -> dict[str, Any]:
    """Score a finished run's model with its own loss and metrics; also written to ``run_dir/eval-<split>.json``.

    Args:
        run_dir: A finished run's directory.
        split: ``val`` (the run's validation data), ``test`` (the source's test split) or ``train``.
        data: Score all of this source instead (a file or folder of the run's kind); the result's split is
            ``data``.
        model: ``final`` (``model.keras``) or ``best`` (``model.best.keras``, with ``output.keep_best``).

    Returns:
        ``loss``, each metric under its name, ``samples``, ``model`` and ``split``.

    Raises:
        ConfigError: not a finished run, no such model or split.
        DataError: the data cannot be read.
    """
    from accumrun.reports.evaluate import evaluate_run

    if split not in ("val", "test", "train") or model not in ("final", "best"):
        raise ValueError(f"split must be val, test or train and model final or best, not {split!r} and {model!r}")
    return evaluate_run(Path(run_dir), split, str(data) if data is not None else None, model)
