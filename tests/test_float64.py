"""``training.precision: float64``: variables, sums, losses and metrics in float64; L-BFGS against scikit-learn and
the closed form to float64's accuracy; subdivided iterates equal plain ones; the measurements; and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_diabetes
from sklearn.linear_model import LogisticRegression

from accumrun import train
from accumrun.config.loading import load_config
from accumrun.core.resolution import FLOAT32_EPSILON, FLOAT64_EPSILON
from accumrun.errors import ConfigError
from accumrun.kinds import Feed, Precision, Split
from accumrun.models.floats import floats
from accumrun.reports.evaluate import evaluate_run
from tests.helpers import write_config
from tests.test_lbfgs import (
    amplified_rounding,
    logistic_lbfgs,
    logistic_terms,
    standardized_breast_cancer,
    table_config,
    write_csv,
)

FLOAT64 = {"precision": "float64"}


def float64_amplified_rounding(per_sample: np.ndarray, hessian: np.ndarray) -> float:
    """test_lbfgs' bound on how far rounding moves the weights, for float64's rounding instead of float32's."""
    return amplified_rounding(per_sample, hessian) * FLOAT64_EPSILON / FLOAT32_EPSILON


def weights_of(model: keras.Model) -> np.ndarray:
    return np.concatenate([w.ravel() for w in model.get_weights()])


def test_floatx_and_the_policy_are_float64_inside_the_scope_and_as_they_were_outside() -> None:
    keras.mixed_precision.set_dtype_policy("float32")  # as a test before may leave it: set, not derived from floatx
    before = keras.config.floatx()
    with floats(Precision.FLOAT64):
        assert keras.config.floatx() == "float64"
        assert keras.mixed_precision.dtype_policy().name == "float64"
    with floats(Precision.MIXED_BFLOAT16):
        assert keras.config.floatx() == before
    assert keras.config.floatx() == before and keras.mixed_precision.dtype_policy().name == "float32"


@pytest.mark.slow
def test_subdivided_and_streamed_iterates_equal_plain_ones_to_1e_9_at_every_iteration() -> None:
    runs = [
        logistic_lbfgs(s, feed, dtype=tf.float64) for s, feed in ((1, Feed.BATCH), (5, Feed.BATCH), (5, Feed.SUB_BATCH))
    ]
    assert all(v.dtype == "float64" for v in runs[0][0].weights) and runs[0][1]._gradient.dtype == "float64"
    start = weights_of(runs[0][0])
    iterates = []
    for _ in range(15):
        for _, optimizer, evaluate_full_batch in runs:
            optimizer.iterate(evaluate_full_batch)
        iterates.append([weights_of(model) for model, _, _ in runs])
    # float64's rounding, amplified by the inverse Hessian as test_lbfgs bounds float32's: about 4e-13, far below
    # the 1e-9 (float32 reached 2.6e-4 by iteration 34).
    bound = float64_amplified_rounding(logistic_terms(start)[0], logistic_terms(iterates[-1][0])[1])
    assert bound < 1e-11
    for iteration, (plain, subdivided, streamed) in enumerate(iterates, 1):
        np.testing.assert_allclose(subdivided, plain, rtol=0, atol=bound, err_msg=f"iteration {iteration}")
        np.testing.assert_allclose(streamed, plain, rtol=0, atol=bound, err_msg=f"iteration {iteration}")


@pytest.mark.slow
def test_a_subdivided_logistic_regression_meets_scikit_learn_to_1e_9(tmp_path: Path) -> None:
    # Subdivided, the run's one end-to-end logistic regression: its iterates equal plain ones (the test above), and
    # a plain float64 run is the least-squares one below.
    x, y = standardized_breast_cancer()
    # scikit-learn's own lbfgs stops on its ftol 1.1e-6 from the minimum whatever tol says (its gradient there is
    # 1.1e-8); its Newton solver at tol=1e-12 lands 1.6e-11 from it (one Newton step), so it is the reference.
    reference = LogisticRegression(C=1.0, tol=1e-12, solver="newton-cholesky").fit(x, y)
    solution = np.concatenate([reference.coef_[0], reference.intercept_])
    per_sample, hessian = logistic_terms(solution)
    gradient = per_sample.mean(0) + np.concatenate([solution[:-1] / len(x), [0.0]])
    assert np.abs(np.linalg.solve(hessian, gradient)).max() < 1e-10
    config = table_config(
        write_csv(tmp_path / "cancer.csv", x, y),
        tmp_path / "run",
        task="binary",
        epochs=80,
        l2=1 / (2 * len(x)),
        training={"subdivisions": 5, **FLOAT64},
        optimizer={"tolerance_grad": 0.0, "tolerance_change": 0.0},
    )
    result = train(config, quiet=True)
    kernel, bias = result.model.get_weights()
    assert kernel.dtype == np.float64
    np.testing.assert_allclose(np.concatenate([kernel[:, 0], bias]), solution, rtol=0, atol=1e-9)


@pytest.mark.slow
def test_least_squares_meets_the_closed_form_to_1e_10(tmp_path: Path) -> None:
    x, y = load_diabetes(return_X_y=True)
    x, y = (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()
    solution = np.linalg.lstsq(np.hstack([x, np.ones((len(x), 1))]), y, rcond=None)[0]
    # Stopped by the gradient alone: 1e-13 over the Hessian 2 X'X / N, whose smallest eigenvalue (the diabetes
    # features are nearly collinear) is 0.017, leaves the weights within 1e-10 of the minimum.
    config = table_config(
        write_csv(tmp_path / "diabetes.csv", x, y),
        tmp_path / "run",
        task="regression",
        epochs=200,
        training=FLOAT64,
        optimizer={"tolerance_grad": 1e-13, "tolerance_change": 0.0},
    )
    rows = np.hstack([x, np.ones((len(x), 1))])
    assert np.linalg.eigvalsh(2 * rows.T @ rows / len(x)).min() > 1e-2
    result = train(config, quiet=True)
    kernel, bias = result.model.get_weights()
    np.testing.assert_allclose(np.concatenate([kernel[:, 0], bias]), solution, rtol=0, atol=1e-10)
    assert result.metrics[-1]["stopped"].startswith("L-BFGS converged: the gradient's largest entry")


def regression_config(
    tmp_path: Path, *, validation: float = 0.25, model: dict[str, Any] | None = None, **training: Any
) -> Path:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 3))
    y = np.tanh(x @ np.array([1.0, -2.0, 0.5]))[:, None] + 0.1 * rng.normal(size=(64, 1))
    np.savez(tmp_path / "data.npz", x=x, y=y)
    return write_config(
        tmp_path / "float64.yaml",
        seed=1,
        data={"name": "npz", "path": str(tmp_path / "data.npz"), "validation_split": validation, "task": "regression"},
        model=model or {"name": "mlp", "hidden": [8], "activation": "tanh"},
        loss={"name": "mean_squared_error"},
        training={"epochs": 2, "batch_size": 16, "subdivisions": 2, **FLOAT64, **training},
        optimizer={"name": "sgd", "learning_rate": 0.1},
        output={"tensorboard": False},
    )


@pytest.mark.slow
def test_a_float64_run_measures_the_noise_scale_and_the_sharpness_and_keeps_floatx(tmp_path: Path) -> None:
    before = keras.config.floatx()
    path = regression_config(tmp_path, measure=["noise_scale", "sharpness"])
    result = train(load_config(path), tmp_path / "run", quiet=True)
    assert keras.config.floatx() == before
    assert all(w.dtype == np.float64 for w in result.model.get_weights())
    for row in result.metrics:
        assert np.isfinite([row["gradient_sq_norm"], row["gradient_trace_cov"], row["sharpness"]]).all()
        assert np.isfinite([row["loss"], row["val_loss"], row["mean_absolute_error"]]).all()


def test_the_loss_and_the_metrics_are_float64_sums(tmp_path: Path) -> None:
    # With the weights held still (a learning rate of 1e-300 moves no float64 weight), the row's loss and mean
    # absolute error are the means over the 64 samples at the final weights: NumPy's float64 means, to float64's
    # rounding of 64 terms (float32's would be 1e-7 off).
    path = regression_config(tmp_path, validation=0.0, epochs=1)
    result = train(load_config(path, ["optimizer.learning_rate=1e-300"]), tmp_path / "run", quiet=True)
    kernel, bias, out_kernel, out_bias = result.model.get_weights()
    with np.load(tmp_path / "data.npz") as arrays:
        x, y = arrays["x"], arrays["y"]
    residual = (np.tanh(x @ kernel + bias) @ out_kernel + out_bias - y)[:, 0]
    (row,) = result.metrics
    assert row["loss"] == pytest.approx(np.mean(residual**2), rel=1e-13)
    assert row["mean_absolute_error"] == pytest.approx(np.mean(np.abs(residual)), rel=1e-13)
    # evaluate scores the saved model with float64 sums too.
    scored = evaluate_run(tmp_path / "run", Split.TRAIN)
    assert scored["loss"] == pytest.approx(np.mean(residual**2), rel=1e-13)
    assert scored["mean_absolute_error"] == pytest.approx(np.mean(np.abs(residual)), rel=1e-13)


def test_float64_refuses_a_model_with_a_mixed_precision_of_its_own(tmp_path: Path) -> None:
    policy = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        inputs = keras.Input((3,))
        model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(4)(inputs)))
    finally:
        keras.mixed_precision.set_dtype_policy(policy)
    model.save(tmp_path / "mixed.keras")
    config = load_config(regression_config(tmp_path, model={"name": "saved", "path": str(tmp_path / "mixed.keras")}))
    with pytest.raises(ConfigError) as raised:
        train(config, tmp_path / "run", quiet=True)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("training.precision: float64 cannot run with the model's own precision: layer")
    assert "mixed_bfloat16" in message


@pytest.mark.slow
def test_a_model_with_batch_norm_trains_in_float64(tmp_path: Path) -> None:
    # BatchNorm's combined moments are kept in its moving statistics' dtype: float64 here, float32 under the rest.
    # The precise mode is the one that combines sub-batch moments; per_batch adds no float64 path of its own.
    batch_norm = "precise"
    path = write_config(
        tmp_path / "cnn.yaml",
        seed=3,
        data={"name": "synthetic", "samples": 26, "shape": [8, 8, 1], "classes": 3, "validation_split": 0.1},
        model={"name": "darknet_cnn", "filters": [4], "strides": [2]},
        training={"epochs": 1, "batch_size": 10, "subdivisions": 3, "batch_norm": batch_norm, **FLOAT64},
        optimizer={"name": "adam", "learning_rate": 0.01},
        output={"tensorboard": False},
    )
    result = train(load_config(path), tmp_path / "run", quiet=True)
    assert all(w.dtype == np.float64 for w in result.model.get_weights())
    assert np.isfinite(result.metrics[0]["loss"])
