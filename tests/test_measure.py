"""What a run measures beside training (``training.measure``).

The gradient noise scale: its two estimates against NumPy on models whose per-sample gradients are written out in
closed form, and its averages over an epoch against the exact population values. The sharpness: against the top
eigenvalue of a dense Hessian, and the same whatever the sub-batches. A measured run against the same run
unmeasured. Resumes that log the same measurements are in tests/test_resume.py; two replicas in
tests/test_distribute.py (the references are in tests/helpers.py, which its child imports too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import train
from accumrun.config.loading import load_config
from accumrun.core.hessian import HessianVectorProducts, top_eigenvalue
from accumrun.core.losses import Objective, sparse_categorical_crossentropy
from accumrun.core.noise import GradientNoise
from accumrun.core.step import make_train_step
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.kinds import Feed
from accumrun.training.setup import build_training
from accumrun.training.sharpness import stability_limit
from tests.helpers import (
    contiguous,
    invoke,
    reference_estimates,
    softmax_gradients,
    tiny_config,
    write_config,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kind", ["whole", "streamed", "loss_scaled"])
def test_one_batch_estimates_equal_the_formulas_on_uneven_sub_batches(kind: str) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(10, 6)).astype(np.float32)
    # Mostly class 0: the mean gradient stands clear of the noise, so |G|^2 is no small difference.
    y = np.array([0, 0, 0, 1, 0, 0, 2, 0, 0, 0], np.int32)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    kernel, bias = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    optimizer = keras.optimizers.SGD(0.1)
    if kind == "loss_scaled":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0**10)
    feed = Feed.SUB_BATCH if kind == "streamed" else Feed.BATCH
    step = make_train_step(
        model, sparse_categorical_crossentropy, optimizer, 3, feed=feed, observers=(GradientNoise(),)
    )
    sizes = sub_batch_sizes(10, 3)
    assert sorted(sizes) == [3, 3, 4]
    chunks = [(tf.constant(x[rows]), tf.constant(y[rows])) for rows in contiguous(sizes)]
    result = step.train_batch(chunks if kind == "streamed" else [(tf.constant(x), tf.constant(y))], 10)

    sq_norm, trace, valid = result.measures.numpy()
    expected_sq_norm, expected_trace = reference_estimates(softmax_gradients(kernel, bias, x, y), contiguous(sizes))
    assert valid == 1.0 and bool(result.applied)
    assert sq_norm == pytest.approx(expected_sq_norm, rel=1e-5)
    assert trace == pytest.approx(expected_trace, rel=1e-5)


def test_token_level_estimates_are_the_same_streamed_as_whole() -> None:
    # A language model's units are its real target tokens (10 windows hold 41), which the streamed step divides by
    # only at the batch's end (its sub-batches divide by the 10 samples): the estimates must not tell the two apart.
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 7, size=10)
    x = np.where(np.arange(6) < lengths[:, None], rng.integers(1, 8, size=(10, 6)), 0).astype(np.int32)
    y = np.where(np.arange(6) < lengths[:, None], rng.integers(1, 8, size=(10, 6)), 0).astype(np.int32)
    objective = Objective(sparse_categorical_crossentropy, token_level=True)
    estimates = {}
    for feed in (Feed.BATCH, Feed.SUB_BATCH):
        keras.utils.set_random_seed(4)
        model = keras.Sequential(
            [keras.Input((6,), dtype="int32"), keras.layers.Embedding(8, 4), keras.layers.Dense(8)]
        )
        step = make_train_step(model, objective, keras.optimizers.SGD(0.1), 3, feed=feed, observers=(GradientNoise(),))
        rows = contiguous(sub_batch_sizes(10, 3)) if feed is Feed.SUB_BATCH else [np.arange(10)]
        chunks = [(tf.constant(x[r]), tf.constant(y[r])) for r in rows]
        estimates[feed] = step.train_batch(chunks, 10).measures.numpy()
    assert int(lengths.sum()) != 10 and estimates[Feed.BATCH][2] == 1.0
    np.testing.assert_allclose(estimates[Feed.SUB_BATCH], estimates[Feed.BATCH], rtol=1e-5)


def linear_regression_config(tmp_path: Path, samples: int, *, shuffle: bool, **training: Any) -> Path:
    """A linear model (``mlp`` without hidden layers) fitting one target by the mean squared error, on
    ``samples`` samples, all for training; SGD."""
    learning_rate = training.pop("learning_rate", 0.05)
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(samples, 3)) + 0.5).astype(np.float32)
    y = (3.0 + x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=samples)).astype(np.float32)[:, None]
    np.savez(tmp_path / "linear.npz", x=x, y=y)
    return write_config(
        tmp_path / "linear.yaml",
        seed=1,
        data={
            "name": "npz",
            "path": str(tmp_path / "linear.npz"),
            "validation_split": 0.0,
            "task": "regression",
            "shuffle": shuffle,
        },
        model={"name": "mlp", "hidden": []},
        loss={"name": "mean_squared_error"},
        training={"measure": ["noise_scale"], **training},
        optimizer={"name": "sgd", "learning_rate": learning_rate},
        output={"tensorboard": False},
    )


def squared_error_gradients(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each sample's gradient of its squared error under the linear model ``weights`` (kernel, bias)."""
    kernel, bias = (np.asarray(w, np.float64) for w in weights)
    residual = x @ kernel + bias - y
    return np.concatenate([2 * residual * x, 2 * residual], axis=1)


@pytest.mark.slow
def test_the_logged_estimates_equal_the_formulas(tmp_path: Path) -> None:
    # One update per epoch: the whole batch of 10 in sub-batches of 3, 3 and 4. That measuring the noise scale moves
    # no weight, and that an unmeasured run logs none of it, is the sharpness test's below (it measures both).
    path = linear_regression_config(tmp_path, 10, shuffle=False, epochs=2, batch_size="full", subdivisions=3)
    measured = train(load_config(path), tmp_path / "measured", quiet=True)
    with np.load(tmp_path / "linear.npz") as arrays:
        x, y = arrays["x"].astype(np.float64), arrays["y"].astype(np.float64)
    weights = [w.numpy().astype(np.float64) for w in build_training(load_config(path)).trained.model.trainable_weights]
    averages = np.zeros(2)
    for row in measured.metrics:
        gradients = squared_error_gradients(weights, x, y)
        sq_norm, trace = reference_estimates(gradients, contiguous(sub_batch_sizes(10, 3)))
        assert row["gradient_sq_norm"] == pytest.approx(sq_norm, rel=1e-5)
        assert row["gradient_trace_cov"] == pytest.approx(trace, rel=1e-5)
        assert row["gradient_noise_scale"] == pytest.approx(trace / sq_norm, rel=1e-5)
        averages = 0.9 * averages + 0.1 * np.array([sq_norm, trace])
        assert row["gradient_noise_scale_ema"] == pytest.approx(averages[1] / averages[0], rel=1e-5)
        # The epoch's one update, by plain gradient descent.
        step = gradients.mean(axis=0)
        weights = [weights[0] - 0.05 * step[:3, None], weights[1] - 0.05 * step[3:]]


@pytest.mark.slow
def test_over_an_epoch_the_estimates_average_to_the_population_values(tmp_path: Path) -> None:
    # 200 batches of 10 drawn without replacement (shuffled, seeded), each in 10 sub-batches of one sample; the
    # weights barely move, so every batch samples the gradients at the initial weights.
    path = linear_regression_config(
        tmp_path, 2000, shuffle=True, epochs=1, batch_size=10, subdivisions=10, learning_rate=1e-12
    )
    (row,) = train(load_config(path), tmp_path / "run", quiet=True).metrics
    with np.load(tmp_path / "linear.npz") as arrays:
        x, y = arrays["x"].astype(np.float64), arrays["y"].astype(np.float64)
    weights = [w.numpy() for w in build_training(load_config(path)).trained.model.trainable_weights]
    gradients = squared_error_gradients(weights, x, y)
    mean = gradients.mean(axis=0)
    trace = float(np.sum((gradients - mean) ** 2) / (len(gradients) - 1))
    assert row["gradient_sq_norm"] == pytest.approx(float(np.sum(mean**2)), rel=0.05)
    assert row["gradient_trace_cov"] == pytest.approx(trace, rel=0.05)


def test_without_sub_batches_the_noise_is_not_measured_and_the_run_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tiny_config(tmp_path, training={"epochs": 1, "measure": ["noise_scale"]}, output={"tensorboard": False})
    result = invoke("train", str(path), "--run-dir", "run", "--no-subdivisions")
    assert result.returncode == 0, result.stderr
    assert "noise_scale is not measured: each batch is one sub-batch on one device" in result.stdout
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not any(key.startswith("gradient_") for key in row)


def dense_hessian(model: keras.Model, objective: Objective, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The Hessian (float64) of ``objective``'s mean loss over ``(x, y)`` in ``model``'s trainable weights, in
    inference mode, from the Jacobian of the gradient."""
    variables = model.trainable_variables
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            loss = tf.reduce_mean(objective.per_sample_loss(tf.constant(y), model(tf.constant(x), training=False)))
        gradient = tf.concat([tf.reshape(g, [-1]) for g in inner.gradient(loss, variables)], 0)
    size = int(gradient.shape[0])
    jacobians = outer.jacobian(gradient, variables)
    return np.concatenate([j.numpy().reshape(size, -1) for j in jacobians], axis=1).astype(np.float64)


def test_the_sharpness_is_the_top_eigenvalue_of_the_dense_hessian() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = rng.integers(3, size=40).astype(np.int32)
    keras.utils.set_random_seed(2)
    # 6*30 + 30 + 30*3 + 3 = 303 weights.
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(30, activation="tanh"), keras.layers.Dense(3)])
    objective = Objective(sparse_categorical_crossentropy)
    hessian = dense_hessian(model, objective, x, y)
    assert hessian.shape == (303, 303)
    expected = np.linalg.eigvalsh((hessian + hessian.T) / 2)[-1]

    # In uneven chunks of 7 samples (the last of 5), as sub-batches.
    def chunks() -> list[tuple[tf.Tensor, tf.Tensor]]:
        return [(tf.constant(x[a : a + 7]), tf.constant(y[a : a + 7])) for a in range(0, 40, 7)]

    products = HessianVectorProducts(model, objective, chunks)
    assert products.dimension == 303
    assert top_eigenvalue(products, products.dimension, seed=0) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(
    ("optimizer", "limit"),
    [
        (keras.optimizers.SGD(0.5), 2 / 0.5),
        (keras.optimizers.SGD(0.5, momentum=0.9), (2 + 2 * 0.9) / 0.5),
        (keras.optimizers.SGD(0.5, momentum=0.9, nesterov=True), (2 + 2 * 0.9) / ((1 + 2 * 0.9) * 0.5)),
        (keras.optimizers.Adam(0.5), None),
    ],
    ids=["gradient-descent", "heavy-ball", "nesterov", "adam"],
)
def test_the_stability_limit_is_that_of_the_optimizers_step(optimizer: Any, limit: float | None) -> None:
    assert stability_limit(optimizer) == (None if limit is None else pytest.approx(limit))


def tanh_mlp_config(folder: Path, **training: Any) -> Path:
    """A tanh MLP on 30 synthetic samples, all for training, one full-batch update per epoch for 4 epochs, in 4
    sub-batches, by plain gradient descent."""
    folder.mkdir()
    return tiny_config(
        folder,
        data={"samples": 30, "validation_split": 0.0},
        model={"name": "mlp", "hidden": [8], "activation": "tanh"},
        training={"epochs": 4, "batch_size": "full", "subdivisions": 4, **training},
        optimizer={"name": "sgd", "learning_rate": 0.5},
        output={"tensorboard": False},
    )


@pytest.mark.slow
def test_the_sharpness_is_the_same_for_any_sub_batches_and_measuring_moves_nothing(tmp_path: Path) -> None:
    # The noise scale, and the sharpness after every second epoch.
    measured = tanh_mlp_config(tmp_path / "measured", measure=["noise_scale", "sharpness"], measure_every=2)
    runs = {
        name: train(load_config(path, overrides), tmp_path / "runs" / name, quiet=True)
        for name, path, overrides in [
            ("S=4", measured, []),
            ("S=1", measured, ["training.subdivisions=1"]),
            ("S=4 streamed", measured, ["data.feed=sub_batch"]),
            ("unmeasured", tanh_mlp_config(tmp_path / "unmeasured"), []),
        ]
    }
    for mine, theirs in zip(runs["S=4"].model.get_weights(), runs["unmeasured"].model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert not any(key.startswith(("sharpness", "gradient_")) for key in runs["unmeasured"].metrics[0])
    # Measured after epochs 2 and 4 alone: the calls of several updates end there.
    assert ["sharpness" in row for row in runs["S=4"].metrics] == [False, True, False, True]
    # Their rows keep the measuring's time apart from training's (the noise scale is measured inside the step).
    assert [row.get("measure_seconds", 0.0) > 0 for row in runs["S=4"].metrics] == [False, True, False, True]
    reference = [row["sharpness"] for row in runs["S=4"].metrics if "sharpness" in row]
    assert reference[0] > 0
    for name in ("S=1", "S=4 streamed"):
        measured = [row["sharpness"] for row in runs[name].metrics if "sharpness" in row]
        assert measured == pytest.approx(reference, rel=1e-5), name
    # Plain gradient descent: 2 / learning rate.
    assert [row.get("sharpness_limit") for row in runs["S=4"].metrics] == [None, 4.0, None, 4.0]


@pytest.mark.parametrize(
    ("training", "message"),
    [
        (
            {"measure": ["noise"]},
            "training.measure[0]: input should be 'noise_scale', 'sharpness' or 'hessian_trace' (got 'noise')",
        ),
        ({"measure": ["noise_scale", "noise_scale"]}, "training.measure: names a measurement twice"),
        (
            {"measure": ["sharpness"], "measure_every": 0},
            "training.measure_every: input should be greater than or equal to 1",
        ),
        (
            {"measure": ["sharpness"], "measure_samples": 100},
            "training.measure_samples: is larger than the 23 training samples; use all",
        ),
        (
            {"measure": ["noise_scale"], "measure_every": 5},
            "training.measure_every: applies to sharpness and hessian_trace; add one of them to training.measure "
            "(got 5)",
        ),
    ],
)
def test_a_bad_measurement_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, training: dict[str, Any], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(tiny_config(tmp_path, training=training)), "--run-dir", "run")
    assert result.returncode == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_edge_of_stability_config_checks_on_the_data_its_example_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = invoke("make-example", "random-labels", str(tmp_path / "random_labels.npz"))
    assert made.returncode == 0, made.stderr
    with np.load(tmp_path / "random_labels.npz") as arrays, np.load(REPO / "datasets" / "digits.npz") as digits:
        x, y, labels = arrays["x"], arrays["y"], digits["y"]
    assert x.shape == (1797, 64) and y.shape == (1797, 10)
    varying = x.std(axis=0) > 0
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(x.std(axis=0)[varying], 1, rtol=1e-4)
    # The labels, permuted: each class as often as in the digits, few where they were.
    assert (y.sum(axis=1) == 1).all() and (y.sum(axis=0) == np.bincount(labels)).all()
    assert (y.argmax(axis=1) == labels).mean() < 0.2
    monkeypatch.chdir(REPO)
    checked = invoke("check", "configs/edge_of_stability.yaml", "--set", f"data.path={tmp_path / 'random_labels.npz'}")
    assert checked.returncode == 0, checked.stderr
