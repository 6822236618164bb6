"""Sample weights (``data.weight``) and class weights (``training.class_weight``): what Keras ``fit`` gives with
``sample_weight`` and ``class_weight``, exact under subdivisions whatever the source and the feed, and refused
with one line where they cannot apply."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import train
from accumrun.config.loading import load_config, load_resume_config
from accumrun.config.schema import data_config
from accumrun.core.losses import Objective, sparse_categorical_crossentropy
from accumrun.core.step import make_train_step
from accumrun.core.targets import Weighted
from accumrun.data.dataset import load_dataset, per_class, with_class_weights
from accumrun.data.examples import write_image_folder, write_tfrecords
from accumrun.errors import DataError
from accumrun.reports.evaluate import evaluate_run
from accumrun.training.setup import build_training
from tests.helpers import Trained, dense_model, invoke, make_data, max_difference, write_config

FEATURES, CLASSES = 5, 3
CLASS_WEIGHT = {"0": 3.0, "2": 0.25}


def arrays(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, class indices and weights in [0, 3) (some near 0, so that weighting changes the gradient)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype(np.float32)
    return x, rng.integers(CLASSES, size=samples).astype(np.int64), rng.uniform(0, 3, samples).astype(np.float32)


def npz_config(tmp_path: Path, **training: Any) -> dict[str, Any]:
    """23 training and 7 test samples with weights ``w_train``/``w_test``; batches of 10, 10, 3, cut 3 ways."""
    x, y, w = arrays(30, seed=4)
    path = tmp_path / "weighted.npz"
    np.savez(path, x_train=x[:23], y_train=y[:23], w_train=w[:23], x_test=x[23:], y_test=y[23:], w_test=w[23:])
    return {
        "seed": 2,
        "data": {"name": "npz", "path": str(path), "validation_split": "test", "shuffle": False},
        "model": {"name": "mlp", "hidden": [8]},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": 3, **training},
        "optimizer": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.5},
        "output": {"tensorboard": False},
    }


def with_data(config: dict[str, Any], **data: Any) -> dict[str, Any]:
    return {**config, "data": {**config["data"], **data}}


def with_training(config: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {**config, "training": {**config["training"], **training}}


def final_weights(result: Any) -> list[np.ndarray]:
    return [v.numpy() for v in result.model.trainable_variables]


# --- the step ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_weighted_sub_batches_accumulate_to_the_weighted_batch_and_to_keras_fit() -> None:
    x, y = make_data(23)
    w = np.random.default_rng(0).uniform(0, 3, 23).astype(np.float32)

    def accumrun_weights(subdivisions: int, weighted: bool) -> list[np.ndarray]:
        model = dense_model()
        step = make_train_step(model, sparse_categorical_crossentropy, keras.optimizers.SGD(0.2), subdivisions)
        for _ in range(2):
            for start in range(0, 23, 10):
                rows = slice(start, start + 10)
                targets = Weighted(tf.constant(y[rows]), tf.constant(w[rows])) if weighted else tf.constant(y[rows])
                step(tf.constant(x[rows]), targets)
        return [v.numpy() for v in model.trainable_variables]

    model = dense_model()
    model.compile(keras.optimizers.SGD(0.2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, sample_weight=w, batch_size=10, epochs=2, shuffle=False, verbose=0)
    keras_fit = [v.numpy() for v in model.trainable_variables]

    plain = accumrun_weights(1, weighted=True)
    assert max_difference(plain, keras_fit) < 2e-5
    assert max_difference(accumrun_weights(3, weighted=True), plain) < 2e-5
    assert max_difference(accumrun_weights(3, weighted=False), plain) > 1e-3  # the weights matter


def test_the_loss_is_the_weighted_sum_over_the_batch_size() -> None:
    # Keras' sum_over_batch_size: divided by the samples, not by the sum of the weights.
    labels, logits = tf.constant([0, 1]), tf.constant([[2.0, 0.0], [0.0, 1.0]])
    loss = Objective(sparse_categorical_crossentropy).per_sample_loss(Weighted(labels, tf.constant([2.0, 0.0])), logits)
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits, sample_weight=[2.0, 0.0])
    assert float(tf.reduce_sum(loss)) / 2 == pytest.approx(float(expected), rel=1e-6)


# --- whole runs against Keras fit -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sample_weight", "class_weight"])
def test_a_weighted_run_equals_keras_fit_in_weights_losses_and_metrics(
    tmp_path: Path, kind: str, trained: Trained
) -> None:
    config = npz_config(tmp_path)
    config = (
        with_data(config, weight="w") if kind == "sample_weight" else with_training(config, class_weight=CLASS_WEIGHT)
    )
    # The sample-weighted run is also the subdivided "npz" run of the every-source test below.
    result = trained(kind, config)

    with np.load(tmp_path / "weighted.npz") as data:
        x, y, w, x_val, y_val, w_val = (
            data[k] for k in ("x_train", "y_train", "w_train", "x_test", "y_test", "w_test")
        )
    model = build_training(load_config(write_config(tmp_path / "c.yaml", **config))).trained.model  # the run's start
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    if kind == "sample_weight":  # validation weighted as Keras weights validation_data=(x, y, sample_weight)
        weighting: dict[str, Any] = {"sample_weight": w, "validation_data": (x_val, y_val, w_val)}
    else:  # class weights are for training alone, in Keras as here
        weighting = {"class_weight": {int(k): v for k, v in CLASS_WEIGHT.items()}, "validation_data": (x_val, y_val)}
    history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0, **weighting).history

    assert max_difference(final_weights(result), [v.numpy() for v in model.trainable_variables]) < 2e-5
    for epoch, row in enumerate(result.metrics):
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):  # metrics unweighted, as Keras' metrics=
            assert row[key] == pytest.approx(history[key][epoch], rel=1e-5, abs=1e-6), key
    # evaluate scores validation by the run's rule: weighted by data.weight, never by class.
    assert evaluate_run(result.run_dir)["loss"] == pytest.approx(result.metrics[-1]["val_loss"], rel=1e-6)
    # What the run recorded resumes with the same config.
    load_resume_config(result.run_dir, tmp_path / "c.yaml")


# --- every source and feed: subdivided equals plain -------------------------------------------------------------


def tfrecord_config(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    write_weighted_records(tmp_path / "shapes", count=23)
    data = {"name": "tfrecord", "path": str(tmp_path / "shapes"), "image_size": [8, 8], "weight": "weight"}
    return {**config, "data": {**data, "shuffle_buffer": 8}}


def write_weighted_records(path: Path, count: int, bad: float | None = None) -> None:
    """TFRecords of 8x8 shape images with a float ``weight`` feature (the last one ``bad`` when given)."""
    write_tfrecords(path, count=count, size=8, seed=1, shards=1)
    (file,) = path.parent.glob(f"{path.name}-*")
    weights = np.random.default_rng(5).uniform(0, 3, count)
    if bad is not None:
        weights[-1] = bad
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(file))]
    with tf.io.TFRecordWriter(str(file)) as writer:
        for record, weight in zip(records, weights, strict=True):
            record.features.feature["weight"].float_list.value.append(weight)
            writer.write(record.SerializeToString())


def image_folder_config(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Class weights on images decoded once into a disk cache (the cached reader looks the weights up)."""
    folder = write_image_folder(tmp_path / "images", count=23, size=8, seed=1)
    data = {"name": "image_folder", "path": str(folder), "image_size": [8, 8], "validation_split": 0.0}
    cached = {**data, "cache": "disk", "cache_dir": str(tmp_path / "cache")}
    return {**with_training(config, class_weight={"bars": 4.0, "disc": 0.5}), "data": cached}


SOURCES = {
    "npz": lambda tmp, config: with_data(config, weight="w"),
    "npz-streamed": lambda tmp, config: with_data(config, weight="w", feed="sub_batch"),
    "tfrecord": tfrecord_config,
    "image_folder-class_weight": image_folder_config,
}
"""Each feed once, a weight feature streamed with its record, and a cache: that every kind of source's weights stay
with their samples (a CSV's weight column among them) is tests/test_sources.py's."""


@pytest.mark.slow
@pytest.mark.parametrize("source", list(SOURCES))
def test_weighted_subdivided_training_equals_plain_for_every_source_and_feed(
    tmp_path: Path, source: str, trained: Trained
) -> None:
    config = SOURCES[source](tmp_path, npz_config(tmp_path))
    if source.startswith("npz"):  # one plain run, in whole batches, for the npz file fed either way
        plain = trained("npz-plain", with_training(SOURCES["npz"](tmp_path, npz_config(tmp_path)), subdivisions=1))
    else:
        plain = train(with_training(config, subdivisions=1), tmp_path / "plain", quiet=True)
    # The npz run is the sample-weighted run compared to Keras fit above (the same file, written again here).
    subdivided = trained("sample_weight", config) if source == "npz" else train(config, tmp_path / "sub", quiet=True)

    assert max_difference(final_weights(plain), final_weights(subdivided)) < 2e-5
    for row_plain, row_sub in zip(plain.metrics, subdivided.metrics, strict=True):
        assert row_sub["loss"] == pytest.approx(row_plain["loss"], rel=1e-5)
    # The control (the same run unweighted ends elsewhere) is the npz run's comparison to Keras fit with its
    # sample_weight above, which an unweighted run misses by far more than its tolerance, and the step's own control.
    if source == "image_folder-class_weight":  # the cached images' batches carry their classes' weights
        _, targets = build_training(load_config(write_config(tmp_path / "c.yaml", **config))).fed.first_batch()
        names = [["bars", "columns", "disc"][i] for i in targets.targets.numpy()]
        expected = [config["training"]["class_weight"].get(name, 1.0) for name in names]
        np.testing.assert_array_equal(targets.weights.numpy(), expected)


# --- class weights ----------------------------------------------------------------------------------------------


def test_balanced_is_scikit_learns_formula_over_the_training_split(tmp_path: Path) -> None:
    # 6 training samples of 3 classes (3, 1, 2): n_samples / (n_classes * count) = 6/9, 6/3, 6/6.
    np.savez(tmp_path / "d.npz", x=np.zeros((7, 2), np.float32), y=np.array([0, 0, 1, 0, 2, 2, 1]))
    dataset = load_dataset(
        data_config(name="npz", path=str(tmp_path / "d.npz"), shuffle=False, validation_split=1 / 7), 0
    )
    np.testing.assert_allclose(per_class("balanced", dataset), [6 / 9, 6 / 3, 6 / 6])
    explicit = with_class_weights(dataset, {"0": 6 / 9, "1": 2.0, "2": 1.0})
    np.testing.assert_allclose(with_class_weights(dataset, "balanced").train.w, explicit.train.w, rtol=1e-7)
    np.testing.assert_allclose(explicit.train.w, [6 / 9, 6 / 9, 2.0, 6 / 9, 1.0, 1.0], rtol=1e-6)
    assert explicit.val is not None and explicit.val.w is None  # validation is not weighted by class
    # Classes the mapping leaves out keep 1.0, as in Keras.
    np.testing.assert_array_equal(per_class({"1": 0.5}, dataset), [1.0, 0.5, 1.0])


def test_class_weights_name_the_classes_as_labels_json_does(tmp_path: Path) -> None:
    lines = ["f,species", *(f"{i},{name}" for i, name in enumerate(["adelie", "gentoo", "adelie", "gentoo"]))]
    (tmp_path / "p.csv").write_text("\n".join(lines) + "\n")
    dataset = load_dataset(
        data_config(name="csv", path=str(tmp_path / "p.csv"), label="species", validation_split=0), 0
    )
    np.testing.assert_array_equal(with_class_weights(dataset, {"gentoo": 4.0}).train.w, [1.0, 4.0, 1.0, 4.0])


def test_classes_called_yes_and_no_weigh_as_any_other_names(tmp_path: Path) -> None:
    # YAML 1.1 reads `yes` and `no` as booleans; the config's YAML 1.2 keeps them the class names they are. The
    # training split a run is given (training/setup.py: the dataset with its class weights) is the same, sample for
    # sample and weight for weight, as with classes named otherwise; how weighted samples train is the tests' above.
    x, y, _ = arrays(24, seed=5)

    def weighted(path: Path, *overrides: str) -> Any:
        config = load_config(path, list(overrides))
        return with_class_weights(load_dataset(config.data, config.seed), config.training.class_weight).train

    splits = []
    for positive, negative in (("yes", "no"), ("pos", "neg")):
        rows = [f"{a},{b},{positive if label else negative}" for (a, b), label in zip(x[:, :2], y % 2, strict=True)]
        (tmp_path / f"{positive}.csv").write_text("a,b,answer\n" + "\n".join(rows) + "\n")
        text = (
            f"seed: 3\ndata: {{name: csv, path: {tmp_path / positive}.csv, label: answer, validation_split: 0}}\n"
            f"model: {{name: mlp, hidden: [4]}}\noutput: {{tensorboard: no}}\n"
            f"training: {{epochs: 2, batch_size: 8, subdivisions: 3,"
            f" class_weight: {{{positive}: 4.0, {negative}: 1.0}}}}\n"
        )
        (tmp_path / f"{positive}.yaml").write_text(text)
        splits.append(weighted(tmp_path / f"{positive}.yaml"))
    named_yes, named_pos = splits
    for a, b in ((named_yes.x, named_pos.x), (named_yes.y, named_pos.y), (named_yes.w, named_pos.w)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(named_yes.w, np.where(named_yes.y == 1, 4.0, 1.0))
    assert 0 < np.count_nonzero(named_yes.y) < 24
    # The control: the weight reaches class `yes` (here through --set): weighed 1.0, every sample weighs 1.0.
    np.testing.assert_array_equal(weighted(tmp_path / "yes.yaml", "training.class_weight.yes=1.0").w, np.ones(24))


def test_check_prints_the_weights_it_will_use(tmp_path: Path) -> None:
    config = with_training(npz_config(tmp_path), class_weight="balanced")
    checked = invoke("check", str(write_config(tmp_path / "c.yaml", **config)))
    assert checked.returncode == 0, checked.stderr
    assert "class_weight: balanced" in checked.stdout


# --- bad inputs -------------------------------------------------------------------------------------------------


def regression_npz(tmp_path: Path) -> dict[str, Any]:
    np.savez(tmp_path / "r.npz", x=np.zeros((8, 2), np.float32), y=np.linspace(0, 1, 8, dtype=np.float32))
    return {"name": "npz", "path": str(tmp_path / "r.npz"), "validation_split": 0}


def bad_weights_npz(tmp_path: Path, value: float) -> dict[str, Any]:
    x, y, w = arrays(23, seed=4)
    w[5] = value
    np.savez(tmp_path / "b.npz", x=x, y=y, w=w)
    return {"name": "npz", "path": str(tmp_path / "b.npz"), "weight": "w"}


BAD = [
    pytest.param(
        lambda tmp: {"training": {"class_weight": {"7": 2.0}}},
        r"training\.class_weight: names no class '7'",
        id="class",
    ),
    pytest.param(
        lambda tmp: {"training": {"class_weight": {"0": -1.0}}}, r"training\.class_weight: .*>= 0", id="negative-class"
    ),
    pytest.param(
        lambda tmp: {"training": {"class_weight": "balanced"}, "data": regression_npz(tmp), "loss": {"name": "mse"}},
        r"training\.class_weight: needs class labels",
        id="regression",
    ),
    pytest.param(
        lambda tmp: {"training": {"class_weight": "balanced"}, "data": {"weight": "w"}},
        r"training\.class_weight: cannot be set with data\.weight",
        id="both",
    ),
    pytest.param(
        lambda tmp: {"data": {"weight": "weights"}}, r"data\.weight: .* has no array 'weights_train'", id="no-array"
    ),
    pytest.param(
        lambda tmp: {"data": bad_weights_npz(tmp, -0.5)}, r"data\.weight: .*'w'.* finite and >= 0", id="negative"
    ),
    pytest.param(lambda tmp: {"data": bad_weights_npz(tmp, np.nan)}, r"data\.weight: .*finite and >= 0", id="nan"),
    pytest.param(lambda tmp: {"data": {"name": "digits", "weight": "w"}}, r"data\.weight", id="source-without-weights"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_weights_are_one_line_naming_the_key(tmp_path: Path, change: Any, message: str) -> None:
    config = npz_config(tmp_path)
    for section, values in change(tmp_path).items():
        merged = {**config.get(section, {}), **values}
        config[section] = merged if section != "data" or "name" not in values else values
    result = invoke("train", str(write_config(tmp_path / "c.yaml", **config)), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert re.search(message, lines[0]), lines[0]


def test_weight_faults_in_csv_and_tfrecord_name_the_column_and_feature(tmp_path: Path) -> None:
    x, y, w = arrays(6, seed=4)
    lines = ["a,w,label", *(f"{x[i, 0]},{-1 if i == 3 else w[i]},{y[i]}" for i in range(6))]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    config = data_config(name="csv", path=str(tmp_path / "t.csv"), label="label", weight="w")
    with pytest.raises(DataError, match=r"data\.weight: .*t\.csv, column 'w': weights must be finite and >= 0"):
        load_dataset(config, 0)
    assert load_dataset(config.model_copy(update={"weight": None}), 0).train.w is None
    write_weighted_records(tmp_path / "shapes", count=6, bad=float("inf"))
    records = data_config(name="tfrecord", path=str(tmp_path / "shapes"), image_size=[8, 8], weight="weight")
    with pytest.raises(DataError, match=r"data\.weight: .*feature 'weight': weights must be finite"):
        load_dataset(records, 0)
    with pytest.raises(DataError, match=r"data\.weight: .*has no feature 'w'; its features are"):
        load_dataset(records.model_copy(update={"weight": "w"}), 0)
