"""``task: binary``: one 0/1 target and one output unit, trained as Keras ``fit`` trains it, chosen by ``auto`` for
a one-unit model on two classes, named by the source's classes, and predicted as a class and its probability.

Tolerances against Keras ``fit`` (derived in :func:`fit_bound` from the data): both take the same 6 SGD updates
(rate 0.2) of a logistic model from the same weights; they differ only in how a batch's gradient, a mean of up to
10 terms x * (sigmoid(z) - y) of size at most max|x|, is summed (Keras once; accumrun in sub-batches combined by
their sizes: at most n = 12 additions). Higham's bound puts each within n * 2^-24 * max|x| of the exact mean, so
an update moves the two runs apart by at most 0.2 * 2 * n * 2^-24 * max|x|, and an earlier difference d grows by
at most the step's Lipschitz factor 1 + 0.2 * max|x|^2 / 4 (the logistic loss's curvature is at most |x|^2 / 4).
The losses, means of per-sample losses whose gradients are at most sum|x| + 1 in size, differ by at most that
times the weights' bound. The accuracies are fractions of the same correct predictions, each a float32 division
of exact integer counts: within 2 * 2^-24 of each other, under 1e-6. A probability is a float32 sigmoid of the same
logits in both, each within a few units in the last place (2^-24) of the exact value: 1e-6 is 16 of them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import yaml

from accumrun import load_config, predict, train
from accumrun.errors import ConfigError, DataError
from accumrun.training.setup import build_training
from tests.helpers import max_difference
from tests.test_bad_inputs import image_folder

# B=10 cut 3 ways (4, 3, 3), and a short last batch of 4: the uneven splits.
SAMPLES, FEATURES, BATCH = 24, 4, 10


def binary_data(seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    return x, (x[:, 0] - x[:, 1] + rng.normal(scale=0.5, size=SAMPLES) > 0).astype(np.int64)


def fit_bound(x: np.ndarray, updates: int = 6, rate: float = 0.2, additions: int = 12) -> tuple[float, float]:
    """The module docstring's bound on how far accumrun's weights and epoch losses may lie from Keras ``fit``'s
    on ``x``: ``(weights, losses)``."""
    step = rate * 2 * additions * 2.0**-24 * float(np.abs(x).max())
    growth = 1 + rate * float((x.astype(np.float64) ** 2).sum(axis=1).max()) / 4
    weights = sum(step * growth**k for k in range(updates))
    return weights, (float(np.abs(x).sum(axis=1).max()) + 1) * weights + len(x) * 2.0**-24


def saved_dense(path: Path, units: int = 1) -> keras.Model:
    """One Dense layer of logits, saved to ``path``."""
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(units)])
    model.save(path)
    return model


def npz_config(tmp_path: Path, model: dict[str, Any], **data: Any) -> dict[str, Any]:
    x, y = binary_data()
    np.savez(tmp_path / "binary.npz", x=x, y=y)
    return {
        "seed": 1,
        "data": {"name": "npz", "path": str(tmp_path / "binary.npz"), "validation_split": 0, "shuffle": False, **data},
        "model": model,
        "training": {"epochs": 2, "batch_size": BATCH, "subdivisions": 3},
        "optimizer": {"name": "sgd", "learning_rate": 0.2},
        "output": {"tensorboard": False},
    }


@pytest.mark.slow
def test_auto_trains_a_one_unit_model_on_0_1_labels_as_keras_fit_does(tmp_path: Path) -> None:
    """Two classes and a one-unit logits model: auto settles on binary, and the run equals Keras ``fit`` at B with
    binary cross-entropy, subdivided or not; a two-unit run of the same data stays classification."""
    model = saved_dense(tmp_path / "one.keras")
    config = npz_config(tmp_path, {"name": "saved", "path": str(tmp_path / "one.keras")})
    subdivided = train(config, tmp_path / "subdivided", quiet=True)
    plain = train({**config, "training": {**config["training"], "subdivisions": 1}}, tmp_path / "plain", quiet=True)

    x, y = binary_data()
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  # Logits above 0: accumrun measures the sigmoid's probability against 0.5.
                  metrics=[keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)])  # fmt: skip
    history = model.fit(x, y.astype(np.float32), batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history

    weights_bound, loss_bound = fit_bound(x)
    assert weights_bound < 2e-5  # about 1.3e-5 on this data
    assert max_difference(subdivided.model.get_weights(), model.get_weights()) < weights_bound
    assert max_difference(plain.model.get_weights(), model.get_weights()) < weights_bound
    for epoch, row in enumerate(subdivided.metrics):
        assert row["loss"] == pytest.approx(history["loss"][epoch], abs=loss_bound)
        assert row["accuracy"] == pytest.approx(history["accuracy"][epoch], abs=1e-6)
    resolved = yaml.safe_load((tmp_path / "subdivided" / "config.yaml").read_text())
    assert resolved["data"]["task"] == "binary"
    assert (resolved["loss"]["name"], resolved["metrics"]) == ("binary_crossentropy", ["accuracy"])
    assert json.loads((tmp_path / "subdivided" / "labels.json").read_text()) == ["0", "1"]

    two_units = build_training(load_config({**config, "model": {"name": "mlp", "hidden": []}}))
    assert (two_units.fed.dataset.task.value, two_units.trained.model.output_shape) == ("classification", (None, 2))


def csv_config(tmp_path: Path) -> dict[str, Any]:
    """A CSV of 24 rows: an ``id`` column, four features and a ``label`` column of ``no`` and ``yes``."""
    x, y = binary_data()
    with (tmp_path / "table.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["id", *(f"f{i}" for i in range(FEATURES)), "label"])
        for i, (row, target) in enumerate(zip(x, y, strict=True)):
            writer.writerow([f"row{i}", *map(float, row), ["no", "yes"][target]])
    return {
        "seed": 1,
        "data": {"name": "csv", "path": str(tmp_path / "table.csv"), "label": "label", "id": "id", "task": "binary"},
        "model": {"name": "mlp", "hidden": [6]},
        "training": {"epochs": 2, "batch_size": BATCH, "subdivisions": 3},
        "output": {"tensorboard": False},
    }


@pytest.mark.slow
def test_task_binary_builds_one_unit_names_the_classes_and_predicts_a_class_and_its_probability(
    tmp_path: Path,
) -> None:
    result = train(csv_config(tmp_path), tmp_path / "run", quiet=True)

    assert result.model.output_shape == (None, 1)
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == ["no", "yes"]
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (resolved["loss"]["name"], resolved["loss"]["from_logits"], resolved["metrics"]) == (
        "binary_crossentropy", True, ["accuracy"]
    )  # fmt: skip
    predictions = predict(tmp_path / "run", [str(tmp_path / "table.csv")])
    assert predictions.columns == ["input", "prediction", "probability", "prob_yes"]
    x, _ = binary_data()
    yes = 1 / (1 + np.exp(-result.model.predict(x, verbose=0)[:, 0]))
    rows = predictions.records()
    assert [row["input"] for row in rows] == [f"row{i}" for i in range(SAMPLES)]
    assert [row["prob_yes"] for row in rows] == pytest.approx(yes, abs=1e-6)
    assert [row["prediction"] for row in rows] == ["yes" if p > 0.5 else "no" for p in yes]
    assert [row["probability"] for row in rows] == pytest.approx(np.maximum(yes, 1 - yes), abs=1e-6)
    assert 0 < sum(p > 0.5 for p in yes) < SAMPLES  # both classes are predicted: the rule is exercised both ways
    with pytest.raises(ConfigError, match="top_k: a binary run predicts one class and its probability"):
        predict(tmp_path / "run", [str(tmp_path / "table.csv")], top_k=2)


def test_an_image_folder_of_two_classes_sets_up_as_binary_named_by_its_folders(tmp_path: Path) -> None:
    # As a run sets it up (labels.json writes these names, as the CSV run above shows); that a one-unit binary run
    # trains subdivided as plain is the npz run's above, and that an image folder streams the same samples for any
    # chunks is the contract over sources (tests/test_sources.py).
    folder = image_folder(tmp_path, "images", ["cat", "dog"])
    config = {
        "data": {"name": "image_folder", "path": str(folder), "image_size": [8, 8], "validation_split": 0.25,
                 "task": "binary"},
        "model": {"name": "mlp", "hidden": [4]},
        "training": {"batch_size": 3, "subdivisions": 2},
    }  # fmt: skip
    setup = build_training(load_config(config))
    assert (setup.fed.dataset.task.value, setup.fed.dataset.class_names) == ("binary", ["cat", "dog"])
    assert setup.trained.model.output_shape == (None, 1)


@pytest.mark.parametrize(
    ("sections", "error", "message"),
    [
        ({"data": "three-classes"}, DataError, r"data: binary needs two classes; the source has 3"),
        ({"model": "two-units"}, ConfigError,
         r"model: a binary task needs one output unit \(the probability of class 1\); the model outputs \(2,\)"),
        ({"loss": {"name": "categorical_crossentropy"}}, ConfigError,
         r"loss\.name: categorical_crossentropy needs one output per class; a binary task has one: use "
         r"binary_crossentropy"),
        ({"metrics": ["top_k_categorical_accuracy"]}, ConfigError,
         r"metrics\[0\]: top_k_categorical_accuracy needs one output per class; a binary task has one: use accuracy"),
    ],
    ids=["three-classes", "two-output-units", "categorical-loss", "top-k-metric"],
)  # fmt: skip
def test_what_cannot_train_as_binary_is_refused_in_one_line(
    tmp_path: Path, sections: dict[str, Any], error: type[Exception], message: str
) -> None:
    config = {**csv_config(tmp_path), **sections}
    if sections.get("model") == "two-units":
        config["model"] = {"name": "saved", "path": str(tmp_path / "two.keras")}
        saved_dense(tmp_path / "two.keras", units=2)
    if sections.get("data") == "three-classes":
        folder = image_folder(tmp_path, "images", ["a", "b", "c"])
        config["data"] = {"name": "image_folder", "path": str(folder), "image_size": [8, 8], "task": "binary"}
    with pytest.raises(error, match=message):
        build_training(load_config(config))


@pytest.mark.parametrize(
    ("y", "task", "message"),
    [
        (np.arange(SAMPLES) % 3, "binary", r"data\.y_train: binary labels must be 0 or 1 \(or set data\.task: "
         r"classification\) \(got 2\)"),
        (np.arange(SAMPLES) % 2, "multi_label", r"multi-label targets must be one row of 0/1 values per sample "
         r"\(for one 0/1 label per sample use data\.task: binary\)"),
    ],
    ids=["binary-label-2", "multi-label-of-one-column"],
)  # fmt: skip
def test_labels_that_are_not_binary_are_named(tmp_path: Path, y: np.ndarray, task: str, message: str) -> None:
    x, _ = binary_data()
    np.savez(tmp_path / "data.npz", x=x, y=y)
    with pytest.raises(DataError, match=message):
        build_training(load_config({"data": {"name": "npz", "path": str(tmp_path / "data.npz"), "task": task}}))
