"""``accumrun evaluate``: score a finished run's saved model with the run's own loss and metrics.

The saved model takes the samples as the source stores them, so they are read without augmentation (a model trained
on crops crops the centre itself). The scoring is the run's validation pass, in batches of one training sub-batch,
so ``--split val --model final`` gives the run's last ``val_*`` figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from accumrun.config.schema import Config
from accumrun.core.sub_batches import batch_sizes
from accumrun.data.dataset import Dataset, load_dataset, sample_floats
from accumrun.data.feeder import Feeder
from accumrun.data.source import Source
from accumrun.errors import AccumrunError, ConfigError, DataError
from accumrun.kinds import ModelFile, Split
from accumrun.models.floats import floats
from accumrun.objective import Scorer, fit_objective
from accumrun.reports.finished import FinishedRun
from accumrun.rundir.atomic import write_text_atomically


def evaluate_run(
    run_dir: Path, split: Split = Split.VAL, data_path: str | None = None, which: ModelFile = ModelFile.FINAL
) -> dict[str, Any]:
    """Score the run's model on ``split`` of its data (all of ``data_path`` when given): :func:`accumrun.evaluate`.
    The result goes to ``eval-<split>.json``, or ``eval-best-<split>.json`` for the best model."""
    run = FinishedRun(run_dir)
    config = run.config
    model_path = run.model_path(which)
    sample_dtype = sample_floats(config.training.precision)
    dataset = load_dataset(config.data, config.seed, sample_dtype)  # the run's data: its task, classes and splits
    samples, name = _split(config, dataset, split, data_path, sample_dtype)
    # A float64 run's metrics sum in float64, as in its validation pass.
    with floats(config.training.precision):
        model = run.load_model(which)
        first_two = samples.subset(np.arange(min(2, samples.size)))
        first = next(iter(Feeder(first_two, [first_two.size], seed=config.seed, shuffle=False).epoch(0)))
        objective = fit_objective(config, dataset, model, first).objective
        scorer = Scorer(model, objective, objective.new_metrics())
        feeder = Feeder(samples, batch_sizes(samples.size, run.sub_batch_size), seed=0, shuffle=False)
        # The scorer gives ``loss`` first, then the metrics without ``val_``.
        result = {**scorer(feeder), "samples": samples.size, "model": model_path.name, "split": name}
    stem = f"eval-{name}" if which is ModelFile.FINAL else f"eval-best-{name}"
    write_text_atomically(run_dir / f"{stem}.json", json.dumps(result, indent=1) + "\n")
    return result


def describe(result: dict[str, Any]) -> str:
    """``eval val (model.keras): loss 0.0318 | accuracy 0.989 | 180 samples``, from an :func:`evaluate_run` result."""
    figures = [f"{key} {value:.4f}" for key, value in result.items() if key not in ("samples", "model", "split")]
    return f"eval {result['split']} ({result['model']}): {' | '.join(figures)} | {result['samples']:,} samples"


def _in_the_runs_classes(other: Dataset, names: list[str] | None) -> Source:
    """All of ``other``'s samples, their class labels numbered as the run numbered its classes (``names``): a file
    numbers the classes it holds by itself, so a file without some of the run's classes would shift the others.

    Raises:
        DataError: the file holds a class the run was not trained on, or other label columns.
    """
    own = other.class_names
    if names is None or own is None or own == names:
        return other.train
    unknown = sorted(set(own) - set(names))
    if unknown or other.train.labels.ndim > 1:  # a multi-label table's own columns, not its classes, differ
        raise DataError("--data", f"has labels the run was not trained on: {unknown or own}; the run's are {names}")
    number = np.array([names.index(name) for name in own])
    return other.train.with_targets(lambda labels: number[labels])


def _split(
    config: Config, dataset: Dataset, split: Split, data_path: str | None, sample_dtype: type[np.floating]
) -> tuple[Source, str]:
    """The samples to score and the name the result goes under (``data`` for another source)."""
    data = config.data
    if data_path is not None:
        try:
            other = load_dataset(data.reading(data_path), config.seed, sample_dtype)
        except AccumrunError as error:
            # The file came from --data, not from the config's data.path: blame the option the user typed.
            raise (error.relabelled("--data") if error.path == "data.path" else error) from None
        return _in_the_runs_classes(other, dataset.class_names), "data"
    if split is Split.TRAIN:
        return dataset.train, split.value
    if split is Split.VAL:
        if dataset.val is None:
            raise ConfigError("split", "the run has no validation data (data.validation_split: 0)", split.value)
        return dataset.val, split.value
    if data.validation_split == Split.TEST.value and dataset.val is not None:
        return dataset.val, split.value
    try:
        test_split = data.model_copy(update={"validation_split": Split.TEST.value})
        held = load_dataset(test_split, config.seed, sample_dtype).val
    except ConfigError:
        held = None
    if held is None:
        raise ConfigError("split", f"data.name: {data.name} has no test split", split.value)
    return held, split.value
