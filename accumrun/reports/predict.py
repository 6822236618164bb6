"""``accumrun predict``: a finished run's model on new inputs, one row per input.

Classification rows give the predicted class name and the top-k classes with their probabilities; binary rows
give the predicted class, its probability, and class 1's probability as ``prob_<its name>``; multi-label
rows give the classes at probability 0.5 or more, then every class's probability; regression rows give the
values. Inputs are raw samples, read in batches of the run's training sub-batch.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import progressbar
import tensorflow as tf

from accumrun.core.sub_batches import batch_sizes
from accumrun.data.feeder import Feeder
from accumrun.data.inputs import InputGroup, InputKind, read_inputs
from accumrun.errors import ConfigError
from accumrun.kinds import ModelFile, Task
from accumrun.reports.finished import FinishedRun
from accumrun.rundir.atomic import write_text_atomically

Cell = str | float


@dataclass(frozen=True)
class Predictions:
    """The table of predictions: its column names and one row per input."""

    columns: list[str]
    rows: list[list[Cell]]

    def records(self) -> list[dict[str, Cell]]:
        """The rows as ``{column: value}`` records."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def write(self, path: str | Path) -> Path:
        """Write a ``.json`` list of records, or else CSV, atomically."""
        path = Path(path)
        if path.suffix.lower() == ".json":
            return write_text_atomically(path, json.dumps(self.records(), indent=1) + "\n")
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([self.columns, *self.rows])
        return write_text_atomically(path, text.getvalue())

    def table(self) -> str:
        """The rows as aligned text columns, probabilities and values to 4 decimals."""
        text = [[f"{cell:.4f}" if isinstance(cell, float) else cell for cell in row] for row in self.rows]
        cells = [self.columns, *text]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        return "\n".join(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells
        )


def predict_run(
    run_dir: Path, inputs: Sequence[str], *, top_k: int | None, which: ModelFile, show_progress: bool, lines: bool
) -> Predictions:
    """Predict every sample of ``inputs`` with the run's model: :func:`accumrun.predict`."""
    run = FinishedRun(run_dir)
    run.refuse_language_model()
    text = run.text_input
    if lines and text is None:
        raise ConfigError("lines", "reads lines of text files; this run's model does not take text")
    model = run.load_model(which)
    labels = run.labels
    if run.task is Task.BINARY and top_k is not None:
        raise ConfigError("top_k", "a binary run predicts one class and its probability", top_k)
    if run.task is Task.CLASSIFICATION and labels is not None:
        top_k = top_k if top_k is not None else min(5, len(labels))
        if not 1 <= top_k <= len(labels):
            raise ConfigError("top_k", f"must be 1 to {len(labels)}, the run's classes", top_k)
    kind = InputKind(
        # Tokenized to the training length (a model of bucketed padding takes any length).
        sample_shape=(text[1],) if text is not None else tuple(model.input_shape[1:]),
        dtype=np.dtype(model.inputs[0].dtype),
        images=run.config.data.images,
        tokenizer=text[0] if text is not None else None,
        features=run.features,
        id_column=run.config.data.id_column,
        text_table=run.config.data.text_table,
    )
    groups = read_inputs(inputs, kind, lines=lines)
    names = [name for group in groups for name in group.names]
    values = _probabilities(run, model, groups, show_progress).reshape(len(names), -1)
    if run.task is Task.REGRESSION:
        columns = ["input", *(f"value_{i}" for i in range(values.shape[1]))]
        return Predictions(columns, [[name, *map(float, row)] for name, row in zip(names, values, strict=True)])
    assert labels is not None  # classification, binary and multi-label runs always write labels.json
    if run.task is Task.BINARY:
        # Class 1 where its probability is above 0.5, as Keras' binary accuracy counts it.
        positive = values[:, 0].astype(float)
        rows: list[list[Cell]] = [
            [name, labels[int(p > 0.5)], p if p > 0.5 else 1.0 - p, p] for name, p in zip(names, positive, strict=True)
        ]
        return Predictions(["input", "prediction", "probability", f"prob_{labels[1]}"], rows)
    if run.task is Task.MULTI_LABEL:
        rows = [
            [name, ";".join(label for label, p in zip(labels, row, strict=True) if p >= 0.5), *map(float, row)]
            for name, row in zip(names, values, strict=True)
        ]
        return Predictions(["input", "prediction", *labels], rows)
    assert top_k is not None
    columns = ["input", "prediction", *(f"top{i}_{what}" for i in range(1, top_k + 1) for what in ("class", "prob"))]
    return Predictions(columns, [_top_k_row(name, row, labels, top_k) for name, row in zip(names, values, strict=True)])


def _probabilities(run: FinishedRun, model: keras.Model, groups: list[InputGroup], show_progress: bool) -> np.ndarray:
    """The model's probabilities for every sample of ``groups``, in order, a sub-batch at a time."""
    to_probabilities = run.probabilities(model)
    forward = tf.function(lambda x: to_probabilities(tf.cast(model(x, training=False), tf.float32)))
    sizes = [batch_sizes(len(group.names), run.sub_batch_size) for group in groups]
    bar = _progress_bar(sum(len(s) for s in sizes)) if show_progress else None
    outputs = []
    for group, chunk_sizes in zip(groups, sizes, strict=True):
        for x, _ in Feeder(group.split, chunk_sizes, seed=0, shuffle=False).epoch(0):
            outputs.append(forward(x).numpy())
            if bar is not None:
                bar.increment()
    if bar is not None:
        bar.finish()
    return np.concatenate(outputs)


def _top_k_row(name: str, probabilities: np.ndarray, labels: list[str], k: int) -> list[Cell]:
    """A classification row; a single sigmoid unit is the probability of class 1 of two."""
    if len(probabilities) == 1:
        probabilities = np.array([1.0 - probabilities[0], probabilities[0]])
    # A stable sort: equal probabilities keep the class order.
    order = np.argsort(-probabilities, kind="stable")[:k]
    pairs = [cell for index in order for cell in (labels[index], float(probabilities[index]))]
    return [name, labels[order[0]], *pairs]


def _progress_bar(count: int) -> progressbar.ProgressBar | None:
    """A bar on stderr over ``count`` batches, on a terminal and for more than one batch; stdout keeps the rows only."""
    if count < 2 or not sys.stderr.isatty():
        return None
    widgets = ["predict ", progressbar.SimpleProgress(), " ", progressbar.Bar(), " ", progressbar.ETA()]
    return progressbar.ProgressBar(max_value=count, widgets=widgets, fd=sys.stderr).start()
