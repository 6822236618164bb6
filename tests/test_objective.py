"""Losses, metrics and outputs: exactness for every loss, softmax models trained as logits models, the task's
defaults, and the errors that refuse what cannot train correctly.

Each property is checked through the run's own train step and validation pass on tiny data (no run folder): the
losses and outputs change nothing a whole run adds, whose rows and files the run tests check once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from accumrun.config.loading import load_config
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.errors import ConfigError
from accumrun.objective import Scorer
from accumrun.training.setup import TrainingSetup, build_training
from tests.helpers import max_difference, write_config


def task_config(tmp_path: Path, task: str, **sections: Any) -> Path:
    """25 samples (20 for training, 5 held out) of a task, in two batches of 10, cut 4-3-3 when subdivided.

    The sub-batches are uneven, which is where a mean of sub-batch means would go wrong; every batch has one
    shape, so each run traces its step once (a short last batch would trace it again, and would add nothing that
    tests/test_step.py does not check).
    Regression targets have 3 columns, from an npz file; the other tasks use synthetic data.
    """
    if task == "regression":
        rng = np.random.default_rng(4)
        x = rng.normal(size=(25, 5)).astype(np.float32)
        y = np.stack([x[:, 0] * 2, x[:, 1] - x[:, 2], np.tanh(x[:, 3])], axis=1) + rng.normal(scale=0.1, size=(25, 3))
        np.savez(tmp_path / "regression.npz", x=x, y=y)
        data = {"name": "npz", "path": str(tmp_path / "regression.npz"), "validation_split": 0.2}
    else:
        data = {"name": "synthetic", "samples": 25, "shape": [5], "classes": 4, "task": task, "validation_split": 0.2}
    config = {
        "seed": 7,
        "data": data,
        "model": {"name": "mlp", "hidden": [8]},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": 1},
        # SGD, not Adam: Adam divides by the gradient's own scale, so a gradient that nearly cancels (the mean
        # absolute error's sign sum) turns float rounding into a visible step; SGD keeps a difference as small.
        "optimizer": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.5},
        "output": {"tensorboard": False},
    }
    for key, value in sections.items():
        merge = isinstance(value, dict) and key != "model"  # a model section names a model of its own
        config[key] = {**config.get(key, {}), **value} if merge else value
    return write_config(tmp_path / f"{task}.yaml", **config)


# Every loss, through the run's train step on tiny tensors: the contract that subdivisions change nothing (an
# end-to-end run of the resident-array path is tests/test_run.py's; the rows' metrics are the task's, so each task's
# metrics are checked here as the step and the validation pass accumulate them).
LOSSES = [
    pytest.param("classification", {"name": "sparse_categorical_crossentropy"}, id="sparse_categorical_crossentropy"),
    pytest.param(
        "classification", {"name": "categorical_crossentropy", "label_smoothing": 0.1}, id="categorical_crossentropy"
    ),
    pytest.param("binary", {"name": "binary_crossentropy", "label_smoothing": 0.1}, id="binary-task"),
    pytest.param("multi_label", {"name": "binary_crossentropy"}, id="binary_crossentropy"),
    pytest.param("regression", {"name": "mean_squared_error"}, id="mean_squared_error"),
    pytest.param("regression", {"name": "mae"}, id="mean_absolute_error"),
    pytest.param("regression", {"name": "huber", "delta": 0.5}, id="huber"),
    pytest.param("regression", {"name": "tests.user_code:squared_error", "scale": 0.5}, id="custom-per-sample"),
]
METRICS = {
    "classification": ["accuracy", {"name": "top_k_categorical_accuracy", "k": 2}, "auc"],
    "binary": ["accuracy", "auc", "precision"],
    "multi_label": ["binary_accuracy", "auc", "precision"],
    "regression": ["mean_absolute_error", "mse"],
}


@dataclass(frozen=True)
class Trajectory:
    """What the run's train step did to a config's model over its epochs, in the run's order (no run folder)."""

    setup: TrainingSetup
    start: list[np.ndarray]
    """The model's initial weights, from the seed."""
    losses: list[float]
    """Each batch's loss sum."""
    rows: list[dict[str, float]]
    """Each epoch's loss (per sample) and training metrics, as its row logs them."""
    validation: dict[str, float]
    """The loss and metrics over the held-out samples after the last epoch, scored as the run's validation scores
    them: in batches of the largest sub-batch."""

    @property
    def weights(self) -> list[np.ndarray]:
        return self.setup.trained.model.get_weights()

    @property
    def updates(self) -> int:
        return int(self.setup.trained.optimizer.iterations.numpy())


def stepped(path: Path, subdivisions: int, overrides: Sequence[str] = ()) -> Trajectory:
    """The config's epochs of batches through the run's train step for ``subdivisions``, then its validation pass."""
    setup = build_training(load_config(path, [f"training.subdivisions={subdivisions}", *overrides]))
    start = setup.trained.model.get_weights()
    step = setup.make_step(subdivisions)
    feeder = setup.fed.train_feeder([size for sizes in setup.fed.chunk_sizes(subdivisions) for size in sizes])
    metrics = setup.stepped.train_metrics
    losses: list[float] = []
    rows = []
    for epoch in range(setup.config.training.epochs):
        metrics.reset()
        results = [step(x, y) for x, y in feeder.epoch(epoch)]
        losses += [float(result.loss_sum) for result in results]
        loss = sum(float(result.loss_sum) for result in results) / sum(float(result.units) for result in results)
        rows.append({"loss": loss, **metrics.results()})
    validation = Scorer(setup.trained.model, setup.trained.objective.objective, setup.trained.val_metrics)(
        setup.fed.val_feeder(max(sub_batch_sizes(setup.fed.batch_size, subdivisions)))
    )
    return Trajectory(setup, start, losses, rows, validation)


@pytest.mark.slow
@pytest.mark.parametrize(("task", "loss"), LOSSES)
def test_the_subdivided_step_equals_the_plain_step_for_every_loss(
    tmp_path: Path, task: str, loss: dict[str, Any]
) -> None:
    path = task_config(tmp_path, task, loss=loss, metrics=METRICS[task])
    plain, subdivided = stepped(path, 1), stepped(path, 3)
    assert max_difference(plain.weights, subdivided.weights) < 1e-5
    assert max_difference(plain.weights, plain.start) > 1e-3  # it trained
    assert subdivided.losses == pytest.approx(plain.losses, rel=1e-5, abs=1e-6)
    assert plain.updates == subdivided.updates == 4  # two whole batches an epoch
    # The rows: the training metrics accumulated over the sub-batches, and validation in batches of 4 and 1
    # against one of 5.
    for row_plain, row_sub in zip(plain.rows, subdivided.rows, strict=True):
        assert row_plain.keys() == row_sub.keys()
        assert row_sub == pytest.approx(row_plain, rel=1e-5, abs=1e-6)
    assert subdivided.validation == pytest.approx(plain.validation, rel=1e-5, abs=1e-6)
    names = [m if isinstance(m, str) else m["name"] for m in METRICS[task]]
    assert list(plain.rows[0]) == list(plain.validation) == ["loss", *names]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "head"),
    [("classification", "softmax"), ("multi_label", "sigmoid")],
)
def test_a_probability_model_trains_like_the_same_model_on_logits(tmp_path: Path, task: str, head: str) -> None:
    user_model = {"name": "tests.user_code:mlp", "hidden": [8]}
    path = task_config(tmp_path, task, model=user_model)
    logits, probabilities = stepped(path, 3), stepped(path, 3, [f"model.head={head}"])

    for row_logits, row_probabilities in zip(logits.rows, probabilities.rows, strict=True):
        assert row_probabilities["loss"] == pytest.approx(row_logits["loss"], rel=1e-4)
    assert probabilities.validation["loss"] == pytest.approx(logits.validation["loss"], rel=1e-4)
    assert max_difference(logits.weights, probabilities.weights) < 1e-4
    # What config.yaml records.
    assert probabilities.setup.config.loss.from_logits is False
    assert logits.setup.config.loss.from_logits is True


def test_from_logits_set_by_the_user_overrides_the_detection(tmp_path: Path) -> None:
    path = task_config(
        tmp_path, "classification", model={"name": "tests.user_code:mlp", "hidden": [8], "head": "softmax"}
    )
    # Keras itself warns that the softmax's output is taken for logits: the user asked for it.
    with pytest.warns(UserWarning, match="received `from_logits=True`"):
        setup = build_training(load_config(path, ["loss.from_logits=true"]))
    assert setup.trained.objective.activation == "softmax"
    assert setup.config.loss.from_logits is True


@pytest.mark.parametrize(
    ("task", "loss", "metrics"),
    [
        ("classification", "sparse_categorical_crossentropy", ["accuracy"]),
        ("binary", "binary_crossentropy", ["accuracy"]),
        ("multi_label", "binary_crossentropy", ["binary_accuracy"]),
    ],
)
def test_loss_and_metrics_default_to_the_task(tmp_path: Path, task: str, loss: str, metrics: list[str]) -> None:
    setup = build_training(load_config(task_config(tmp_path, task)))
    assert (setup.config.data.task, setup.config.loss.name, setup.config.metrics) == (task, loss, metrics)
    assert setup.config.loss.from_logits is True
    assert f"loss {loss}, from_logits=True; metrics {metrics[0]}" in setup.trained.objective.describe()


def test_regression_without_a_loss_says_which_to_set(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"loss\.name: regression targets of shape \(3,\) need a loss; set loss"):
        build_training(load_config(task_config(tmp_path, "regression")))


@pytest.mark.parametrize(
    ("task", "overrides", "message"),
    [
        (
            "regression",
            ["loss.name=sparse_categorical_crossentropy"],
            r"loss\.name: sparse_categorical_crossentropy takes integer class labels, but the targets are "
            r"regression values; use mean_squared_error",
        ),
        ("classification", ["loss.name=categorical_crossentrpy"], r"loss\.name: unknown loss; did you mean "),
        ("classification", ["metrics=[acuracy]"], r"metrics\[0\]: unknown metric; did you mean 'Accuracy'"),
        ("classification", ["loss.name=mse", "loss.from_logits=true"], r"loss\.from_logits: MeanSquaredError has"),
        ("classification", ["loss.delta=2"], r"loss\.delta: SparseCategoricalCrossentropy has no such argument"),
        ("regression", ["loss.name=mse", "metrics=[accuracy]"], r"metrics\[0\]: accuracy needs class labels"),
        (
            "regression",
            ["loss.name=tests.user_code:mean_squared_error_of_the_batch"],
            r"returned shape \(\) for 2 samples; accumrun needs one value per sample",
        ),
    ],
    ids=[
        "class-label-loss-for-float-targets",
        "unknown-loss",
        "unknown-metric",
        "from-logits-for-a-loss-without-it",
        "keyword-the-loss-does-not-take",
        "accuracy-for-regression",
        "custom-loss-without-per-sample-values",
    ],
)
def test_loss_and_metric_errors_name_the_key(tmp_path: Path, task: str, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_training(load_config(task_config(tmp_path, task), overrides))


def save_model(path: Path, inputs: int, outputs: int, head: str | None = "softmax") -> Path:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(outputs, activation=head)])
    model.save(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_a_saved_softmax_model_trains_on_probabilities(tmp_path: Path, suffix: str) -> None:
    saved = save_model(tmp_path / f"user{suffix}", inputs=5, outputs=4)
    path = task_config(tmp_path, "classification", model={"name": "saved", "path": str(saved)})
    result = stepped(path, 1)
    assert result.setup.trained.model.output_shape == (None, 4)
    assert result.setup.config.loss.from_logits is False  # what config.yaml records
    assert max_difference(result.weights, keras.models.load_model(saved).get_weights()) > 1e-3


@pytest.mark.parametrize(
    ("task", "inputs", "outputs", "message"),
    [
        ("classification", 5, 3, r"class labels 0\.\.3 need an output of shape \(4,\), one unit per class; "
         r"the model outputs \(3,\)"),
        ("regression", 5, 2, r"regression targets of shape \(3,\) need an output of shape \(3,\); "
         r"the model outputs \(2,\)"),
        ("classification", 6, 4, r"model\.path: the model takes inputs of shape \(6,\), the data's samples have "
         r"shape \(5,\)"),
    ],
    ids=["labels-out-of-range-for-the-output", "regression-output-shape", "input-shape"],
)  # fmt: skip
def test_a_saved_model_that_does_not_fit_the_data_is_refused(
    tmp_path: Path, task: str, inputs: int, outputs: int, message: str
) -> None:
    saved = save_model(tmp_path / "user.keras", inputs, outputs, head=None)
    path = task_config(tmp_path, task, model={"name": "saved", "path": str(saved)}, loss={"name": "mse"})
    overrides = [] if task == "regression" else ["loss.name=sparse_categorical_crossentropy"]
    with pytest.raises(ConfigError, match=message):
        build_training(load_config(path, overrides))


APPLICATION = {"name": "keras.applications.MobileNetV2", "alpha": 0.35}


def application_config(tmp_path: Path, **model: Any) -> Path:
    """MobileNetV2 at a third of its width on 16 synthetic 32x32 RGB images: the smallest input it takes."""
    return write_config(
        tmp_path / "application.yaml",
        seed=2,
        data={"name": "synthetic", "samples": 16, "shape": [32, 32, 3], "classes": 3, "validation_split": 0.0},
        model={**APPLICATION, **model},
        training={"epochs": 1, "batch_size": 8, "subdivisions": 2},
        output={"tensorboard": False},
    )


@pytest.fixture(scope="module")
def application(tmp_path_factory: pytest.TempPathFactory) -> TrainingSetup:
    """The application config's setup (random weights), built once for the tests that only read it."""
    return build_training(load_config(application_config(tmp_path_factory.mktemp("application"))))


@pytest.mark.slow
def test_an_application_gets_a_logits_head_sized_to_the_task(application: TrainingSetup) -> None:
    setup = application
    assert setup.trained.model.input_shape == (None, 32, 32, 3) and setup.trained.model.output_shape == (None, 3)
    assert setup.trained.objective.activation is None and setup.config.loss.from_logits is True


@pytest.mark.slow
def test_an_application_with_its_own_top_is_trained_on_probabilities(tmp_path: Path) -> None:
    setup = build_training(load_config(application_config(tmp_path, include_top=True)))
    assert setup.trained.model.output_shape == (None, 3)
    assert setup.trained.objective.activation == "softmax" and setup.config.loss.from_logits is False
    assert "model outputs probabilities (softmax): loss uses from_logits=False" in setup.trained.objective.describe()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> TrainingSetup:
    """The application config's setup with its base's weights from a file this fixture saves (never imagenet) and
    the base frozen: built once for the tests of both."""
    folder = tmp_path_factory.mktemp("pretrained")
    base = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, include_top=False, pooling="avg", weights=None
    )
    base.save_weights(folder / "base.weights.h5")
    return build_training(
        load_config(application_config(folder, weights=str(folder / "base.weights.h5"), freeze_base=True))
    )


@pytest.mark.slow
def test_freeze_base_trains_the_head_alone(pretrained: TrainingSetup) -> None:
    # One batch of 8 in 2 sub-batches through the run's train step.
    model = pretrained.trained.model
    initial = {v.path: v.numpy() for v in model.variables}
    step = pretrained.make_step(2)
    assert bool(step(*pretrained.fed.first_batch()).applied)
    final = {v.path: v.numpy() for v in model.variables}
    head = {path for path in final if path.startswith("head/")}
    assert head and all(not np.array_equal(initial[p], final[p]) for p in head)
    # Weights and BatchNorm statistics of the base: exactly as built.
    assert all(np.array_equal(initial[p], final[p]) for p in final if p not in head)


def test_an_input_smaller_than_the_application_takes_names_the_minimum(tmp_path: Path) -> None:
    config = load_config(application_config(tmp_path), ["data.shape=[16,16,3]"])
    with pytest.raises(ConfigError, match=r"MobileNetV2 refused input shape \(16, 16, 3\): .*at least 32x32"):
        build_training(config)


@pytest.mark.slow
def test_imagenet_weights_without_a_network_is_one_line_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keras.src.utils import file_utils

    def offline(fname: str, origin: str, **_: Any) -> str:
        # What Keras' get_file raises when the download fails (keras/src/utils/file_utils.py).
        raise Exception(f"URL fetch failure on {origin}: None -- [Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(file_utils, "get_file", offline)
    config = load_config(application_config(tmp_path, weights="imagenet"))
    with pytest.raises(ConfigError) as refused:
        build_training(config)
    assert refused.value.message == (
        "model.weights: could not download the imagenet weights (no network?); use weights: null to train from "
        "scratch, or the path of a weights file you have (got 'imagenet')"
    )


@pytest.mark.slow
def test_a_pretrained_application_gets_its_own_preprocess_input(
    pretrained: TrainingSetup, application: TrainingSetup
) -> None:
    # MobileNetV2 expects 0..255 mapped to [-1, 1] (whatever its weights: the two sides use the same).
    assert pretrained.config.data.rescale == "auto"
    x = np.random.default_rng(0).uniform(0, 255, size=(2, 32, 32, 3)).astype(np.float32)
    inner = pretrained.trained.model.layers[-1]
    expected = inner(x / 127.5 - 1, training=False).numpy()
    np.testing.assert_allclose(pretrained.trained.model(x, training=False).numpy(), expected, atol=1e-5)
    # Without pretrained weights, rescale: auto leaves float samples as they are.
    assert application.config.data.rescale == 1.0


@pytest.mark.slow
def test_the_mlp_l2_key_adds_l2_times_the_squared_kernels_to_the_objective(tmp_path: Path) -> None:
    # One full-batch update of SGD (its momentum has nothing to carry yet): the epoch's loss is at the initial
    # weights, and the update moves each kernel by lr * 2 * l2 * kernel more than without the key.
    model = {"name": "mlp", "hidden": [], "l2": 0.1}
    training = {"epochs": 1, "batch_size": "full"}
    path = task_config(tmp_path, "regression", model=model, loss={"name": "mean_squared_error"}, training=training)
    regularized, plain = stepped(path, 1), stepped(path, 1, ["model.l2=0"])
    kernel, _ = regularized.start
    added = regularized.rows[0]["loss"] - plain.rows[0]["loss"]
    assert added == pytest.approx(0.1 * float(np.sum(kernel.astype(np.float64) ** 2)), rel=1e-4)
    (kernel_l2, bias_l2), (kernel_plain, bias_plain) = regularized.weights, plain.weights
    np.testing.assert_allclose(kernel_l2 - kernel_plain, -0.1 * 2 * 0.1 * kernel, atol=1e-6)
    np.testing.assert_allclose(bias_l2, bias_plain, atol=1e-6)
