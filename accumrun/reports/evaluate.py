"""``accumrun evaluate``: score a finished run's saved model on its validation, test or training data, or on
another source of the same kind, with the run's own loss and metrics.

The model is the saved one (``model.keras`` or ``model.best.keras``): it takes the samples as the source stores
them, so they are read without augmentation (a model trained on crops crops the centre itself). The scoring is
the run's validation pass: the same per-sample loss, the same metrics, in batches of one training sub-batch, in
inference mode. So ``--split val --model final`` gives the run's last ``val_*`` figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accumrun.config.schema import Config
from accumrun.core.split import batch_sizes
from accumrun.data.dataset import Dataset, load_dataset
from accumrun.data.feeder import Feeder
from accumrun.data.splits import Split as SplitSamples
from accumrun.errors import ConfigError
from accumrun.kinds import ModelFile, Split
from accumrun.objective import Scorer, fit_objective
from accumrun.reports.finished import FinishedRun
from accumrun.rundir.atomic import write_text_atomically

_DATA = "data"
"""The split name of a result scored on another source (``data_path``)."""


@dataclass(frozen=True)
class EvalResult:
    """``eval-<split>.json``: the mean loss and each metric over the scored samples, which model scored them and
    on what. :meth:`to_json` writes it, :meth:`from_json` reads it."""

    loss: float
    figures: dict[str, float]
    """Each metric under its name, without ``val_``."""
    samples: int
    model: str
    """The model's file: ``model.keras`` or ``model.best.keras``."""
    split: str
    """``val``, ``test``, ``train``, or ``data`` for another source."""

    def to_json(self) -> dict[str, Any]:
        """The result as the file and the Python API hold it: ``loss``, the metrics, then the bookkeeping."""
        return {"loss": self.loss, **self.figures, "samples": self.samples, "model": self.model, "split": self.split}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> EvalResult:
        """The result from its JSON object; keys other than the bookkeeping ones are metrics."""
        fixed = ("loss", "samples", "model", "split")
        figures = {key: float(value) for key, value in document.items() if key not in fixed}
        return cls(document["loss"], figures, document["samples"], document["model"], document["split"])

    def describe(self) -> str:
        """``eval val (model.keras): loss 0.0318 | accuracy 0.989 | 180 samples``."""
        figures = [f"{key} {value:.4f}" for key, value in {"loss": self.loss, **self.figures}.items()]
        return f"eval {self.split} ({self.model}): {' | '.join(figures)} | {self.samples:,} samples"


def evaluate_run(
    run_dir: Path, split: Split = Split.VAL, data_path: str | None = None, which: ModelFile = ModelFile.FINAL
) -> dict[str, Any]:
    """Score the run's model on ``split`` of its data (all of ``data_path`` when given); write and return
    ``eval-<split>.json`` (``eval-best-<split>.json`` for the best model; ``data`` as the split for
    ``data_path``): ``loss``, each metric under its name, ``samples``, ``model``, ``split``.

    Raises:
        ConfigError: ``run_dir`` is not a finished run, the model or the split does not exist.
        DataError: the data cannot be read.
    """
    run = FinishedRun(run_dir)
    config = run.config
    model_path = run.model_path(which)
    dataset = load_dataset(config.data, config.seed)  # the run's data: its task, classes and splits
    samples, name = _split(config, dataset, split, data_path)
    model = run.load_model(which)
    first_two = samples.subset(np.arange(min(2, samples.size)))
    first = next(iter(Feeder(first_two, [first_two.size], seed=config.seed, shuffle=False).epoch(0)))
    objective = fit_objective(config, dataset, model, first).objective
    scorer = Scorer(model, objective, objective.new_metrics())
    feeder = Feeder(samples, batch_sizes(samples.size, run.sub_batch_size), seed=0, shuffle=False)
    scores = scorer(feeder)
    loss = scores.pop("loss")
    result = EvalResult(loss, scores, samples.size, model_path.name, name)
    stem = f"eval-{name}" if which is ModelFile.FINAL else f"eval-best-{name}"
    write_text_atomically(run_dir / f"{stem}.json", json.dumps(result.to_json(), indent=1) + "\n")
    return result.to_json()


def describe(result: dict[str, Any]) -> str:
    """``eval val (model.keras): loss 0.0318 | accuracy 0.989 | 180 samples``, from what :func:`evaluate_run`
    returned."""
    return EvalResult.from_json(result).describe()


def _split(config: Config, dataset: Dataset, split: Split, data_path: str | None) -> tuple[SplitSamples, str]:
    """The samples to score and the name the result goes under."""
    data = config.data
    if data_path is not None:
        return load_dataset(data.reading(data_path), config.seed).train, _DATA
    if split is Split.TRAIN:
        return dataset.train, split.value
    if split is Split.VAL:
        if dataset.val is None:
            raise ConfigError("split", "the run has no validation data (data.validation_split: 0)", split.value)
        return dataset.val, split.value
    if data.validation_split == Split.TEST.value and dataset.val is not None:
        return dataset.val, split.value
    try:
        held = load_dataset(data.model_copy(update={"validation_split": Split.TEST.value}), config.seed).val
    except ConfigError:
        held = None
    if held is None:
        raise ConfigError("split", f"data.name: {data.name} has no test split", split.value)
    return held, split.value
