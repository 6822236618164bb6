"""Full-batch L-BFGS: its line search on functions with known answers, its iterates (subdivided, streamed and plain
alike), and whole runs against scikit-learn's and the closed-form solutions."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.linear_model import LogisticRegression

from accumrun import evaluate, train
from accumrun.core.lbfgs import Lbfgs
from accumrun.core.line_search import CURVATURE, NOISE, SUFFICIENT_DECREASE, Point, strong_wolfe
from accumrun.core.losses import Objective
from accumrun.core.step import make_train_step
from accumrun.kinds import Feed, Precision
from accumrun.models.floats import floats


def standardized_breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_breast_cancer(return_X_y=True)
    return (x - x.mean(0)) / x.std(0), y


def write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    header = ",".join([*(f"f{i}" for i in range(x.shape[1])), "target"])
    # Python's own numbers: numpy's repr would write np.int64(1).
    rows = [",".join(str(v) for v in [*row.tolist(), target.item()]) for row, target in zip(x, y, strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def table_config(path: Path, run_dir: Path, *, task: str, epochs: int, l2: float = 0.0, **sections: Any) -> dict:
    """A linear model on the CSV at ``path``, all of it in one full batch, with L-BFGS."""
    config: dict[str, Any] = {
        "seed": 0,
        "data": {"name": "csv", "path": str(path), "label": "target", "validation_split": 0.0, "task": task},
        "model": {"name": "mlp", "hidden": [], "l2": l2},
        "training": {"epochs": epochs, "batch_size": "full", "subdivisions": 1},
        "optimizer": {"name": "lbfgs"},
        "output": {"run_dir": str(run_dir), "tensorboard": False},
    }
    if task == "regression":
        config["loss"] = {"name": "mean_squared_error"}
    for name, section in sections.items():
        config[name] = {**config.get(name, {}), **section}
    return config


def run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


# --- the line search ----------------------------------------------------------------------------------------------


def along(f: Any, df: Any) -> Any:
    """``phi(t)`` of a function of one variable, with its derivative."""
    return lambda t: Point(t, float(f(t)), float(df(t)), None)


def assert_strong_wolfe(point: Point[None], start: Point[None]) -> None:
    assert point.value <= start.value + SUFFICIENT_DECREASE * point.step * start.slope
    assert abs(point.slope) <= -CURVATURE * start.slope


@pytest.mark.parametrize(
    ("first_step", "most_evaluations"),
    # A step far too short is extrapolated (at most 10x each time); one far too long is bracketed and zoomed.
    [(1e-3, 5), (1.0, 1), (100.0, 6)],
)
def test_the_line_search_accepts_a_strong_wolfe_step(first_step: float, most_evaluations: int) -> None:
    # phi(t) = (t - 2)^2 + sin(3 t) / 4: a minimum near 1.8 with ripples.
    phi = along(lambda t: (t - 2) ** 2 + math.sin(3 * t) / 4, lambda t: 2 * (t - 2) + 0.75 * math.cos(3 * t))
    start = phi(0.0)
    search = strong_wolfe(phi, start, first_step)
    assert search.satisfied and search.evaluations <= most_evaluations
    assert_strong_wolfe(search.point, start)


def test_a_value_that_is_not_finite_shrinks_the_step() -> None:
    # Beyond t = 1.5 the objective overflows; the minimum is at 1.
    inside = along(lambda t: (t - 1) ** 2, lambda t: 2 * (t - 1))

    def phi(t: float) -> Point[None]:
        return inside(t) if t < 1.5 else Point(t, math.inf, math.nan, None)

    start = phi(0.0)
    search = strong_wolfe(phi, start, 10.0)
    assert search.satisfied and search.point.step < 1.5
    assert_strong_wolfe(search.point, start)


def test_the_line_search_refuses_an_ascent_direction() -> None:
    phi = along(lambda t: t * t + t, lambda t: 2 * t + 1)
    with pytest.raises(ValueError, match="needs a descent direction; phi'\\(0\\) is 1.0"):
        strong_wolfe(phi, Point(0.0, 0.0, 1.0, None), 1.0)


# --- iterates ---------------------------------------------------------------------------------------------------


class _Evaluation:
    def __init__(self, loss_sum: tf.Tensor, units: tf.Tensor, applied: tf.Tensor) -> None:
        self.objective = float(loss_sum) / float(units)
        self.finite = bool(applied)


def logistic_lbfgs(
    subdivisions: int, feed: Feed, history: int = 10, dtype: tf.DType = tf.float32
) -> tuple[keras.Model, Lbfgs, Any]:
    """A logistic regression on the breast-cancer data, its L-BFGS, and what evaluates the full batch through the
    step of ``subdivisions`` fed by ``feed`` (whole, or as five streamed sub-batches); built, stepped and fed in
    ``dtype`` (float64: under ``training.precision: float64``'s floatx and policy, as tests/test_float64.py needs)."""
    x, y = standardized_breast_cancer()
    float64 = dtype == tf.float64
    with floats(Precision.FLOAT64 if float64 else Precision.FLOAT32):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((30,)), keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(1 / (2 * len(x))))]
        )
        if float64:  # the penalty's rate as a float64 number too, so that nothing on its way rounds it to float32
            model.layers[0].kernel_regularizer.l2 = np.float64(1 / (2 * len(x)))
        loss = keras.losses.BinaryCrossentropy(from_logits=True, reduction=None)
        optimizer = Lbfgs(history=history, tolerance_grad=0.0, tolerance_change=0.0)
        objective = Objective(lambda t, p: loss(t[:, None], p), dtype=dtype)
        step = make_train_step(model, objective, optimizer, subdivisions, feed=feed)
    xs, ys = tf.constant(x, dtype), tf.constant(y, dtype)
    if feed is Feed.SUB_BATCH:
        cuts = np.linspace(0, len(x), subdivisions + 1).astype(int)
        chunks = [(xs[a:b], ys[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    else:
        chunks = [(xs, ys)]

    def evaluate_full_batch() -> _Evaluation:
        return _Evaluation(*step.train_batch(chunks, len(x))[:3])

    return model, optimizer, evaluate_full_batch


def amplified_rounding(per_sample: np.ndarray, hessian: np.ndarray) -> float:
    """How far float32 rounding can move float32 weights: every component of a gradient rounded at the scale of its
    per-sample terms ``g_i`` (``eps * sqrt(p) * max_j mean_i |g_ij|`` in norm), amplified by the inverse Hessian
    (``||H^-1||``). Each CPU sums in its own order, so the rounding differs between CPUs but stays under this."""
    eps = float(np.finfo(np.float32).eps)
    scale = float(np.abs(per_sample).mean(0).max())
    return eps * math.sqrt(per_sample.shape[1]) * scale * float(np.linalg.norm(np.linalg.inv(hessian), 2))


def gamma(n: int) -> float:
    """Higham's ``gamma_n``: the relative error that ``n`` float32 roundings in a row can reach."""
    unit = float(np.finfo(np.float32).eps) / 2
    return n * unit / (1 - n * unit)


def mean_square_rounding(rows: np.ndarray, weights: np.ndarray, y: np.ndarray) -> float:
    """How far a float32 computation of the mean squared error of ``rows @ weights`` against ``y`` can be from the
    exact one, whatever the order of its sums: each residual rounded in its dot product and its subtraction
    (``gamma`` of the row's length plus one, times its terms' magnitudes), squared (one rounding), the squares summed
    (``gamma`` of the sample count) and divided (one rounding)."""
    residuals = rows @ weights - y
    errors = gamma(rows.shape[1] + 1) * (np.abs(rows * weights).sum(1) + np.abs(y))
    squares = residuals**2 + 2 * np.abs(residuals) * errors + errors**2
    total = (squares - residuals**2).sum() + gamma(1) * squares.sum() + gamma(len(y)) * squares.sum()
    return float(total / len(y) + gamma(1) * squares.mean())


def logistic_terms(weights: np.ndarray, sample_weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The per-sample gradients and the Hessian, in float64, of the breast-cancer logistic regression with
    ``l2 = 1 / (2 N)`` at ``weights`` (the kernel, then the bias)."""
    x, y = standardized_breast_cancer()
    rows = np.hstack([x, np.ones((len(x), 1))])
    weight = np.ones(len(x)) if sample_weight is None else sample_weight
    p = 1 / (1 + np.exp(-rows @ weights))
    per_sample = (weight * (p - y))[:, None] * rows
    l2 = np.diag([1 / len(x)] * x.shape[1] + [0.0])
    return per_sample, rows.T @ (rows * (weight * p * (1 - p))[:, None]) / len(x) + l2


def test_subdivided_and_streamed_iterates_equal_plain_ones_each_iteration() -> None:
    plain, *subdivided = [
        logistic_lbfgs(s, feed) for s, feed in ((1, Feed.BATCH), (5, Feed.BATCH), (5, Feed.SUB_BATCH))
    ]
    start = np.concatenate([w.ravel() for w in plain[0].get_weights()]).astype(np.float64)
    spent = [0, 0, 0]
    iterates = []
    for _ in range(20):
        weights = []
        for k, (model, optimizer, evaluate_full_batch) in enumerate((plain, *subdivided)):
            spent[k] += optimizer.iterate(evaluate_full_batch).evaluations
            weights.append(np.concatenate([w.ravel() for w in model.get_weights()]))
        iterates.append(weights)
        # Streamed sub-batches are the same sums as sub-batches cut on the device: bit for bit.
        np.testing.assert_array_equal(weights[2], weights[1])
    # The same sums in another order differ by float32 rounding, which the inverse Hessian (its largest eigenvalue
    # about 570) amplifies into the iterates. Bounded from the first gradient's terms and the last Hessian: 2.2e-4.
    # The differences seen are far below it (1.4e-6 on one CPU, 1.7e-6 on another), and a real fault far above
    # (leaving out one row of the 569 moves the solution 8.5e-4; one sub-batch of 114, 0.4).
    bound = amplified_rounding(logistic_terms(start)[0], logistic_terms(iterates[-1][0].astype(np.float64))[1])
    assert 1e-4 < bound < 4e-4
    for iteration, (plain_weights, subdivided_weights, _) in enumerate(iterates, 1):
        np.testing.assert_allclose(
            subdivided_weights, plain_weights, rtol=0, atol=bound, err_msg=f"iteration {iteration}"
        )
    # One accepted step per iteration; every evaluation (the start's and the line searches') counted once.
    for (_, optimizer, _), evaluations in zip((plain, *subdivided), spent, strict=True):
        assert int(optimizer.iterations.numpy()) == 20 and optimizer.evaluations == evaluations > 20


def two_loop(gradient: np.ndarray, pairs: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """``-H g`` by Nocedal and Wright's algorithm 7.4, in float64, over ``pairs`` oldest to newest."""
    q, alphas = gradient.copy(), []
    for s, y in reversed(pairs):
        alpha = (s @ q) / (y @ s)
        alphas.append(alpha)
        q -= alpha * y
    s, y = pairs[-1]
    r = q * (s @ y) / (y @ y)
    for (s, y), alpha in zip(pairs, reversed(alphas), strict=True):
        r += s * (alpha - (y @ r) / (y @ s))
    return -r


def test_the_direction_is_the_two_loop_recursion_over_the_newest_pairs_once_the_history_is_full() -> None:
    _, optimizer, evaluate_full_batch = logistic_lbfgs(1, Feed.BATCH, history=3)
    for _ in range(7):
        optimizer.iterate(evaluate_full_batch)
    assert int(optimizer._pairs.numpy()) > 4  # more pairs than the 3 kept: the oldest have dropped out
    # The slots hold the newest pairs, oldest first.
    pairs = (optimizer._s, optimizer._y)
    stored = [(s.numpy().astype(np.float64), y.numpy().astype(np.float64)) for s, y in zip(*pairs, strict=True)]
    gradient = optimizer._gradient.numpy().astype(np.float64)
    direction = optimizer._vectors.begin().direction.numpy()
    np.testing.assert_allclose(direction, two_loop(gradient, stored), rtol=1e-5, atol=1e-9)


def test_weights_that_are_not_finite_stop_before_any_step() -> None:
    model, optimizer, evaluate_full_batch = logistic_lbfgs(1, Feed.BATCH)
    kernel = model.trainable_variables[0]
    kernel.assign(tf.fill(kernel.shape, math.nan))
    iteration = optimizer.iterate(evaluate_full_batch)
    assert iteration.stopped == "L-BFGS stopped: the objective or its gradient is not finite at the starting weights"
    assert not iteration.evaluation.finite and int(optimizer.iterations.numpy()) == 0


# --- whole runs -----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("subdivisions", "class_weight"),
    # Subdivided and class-weighted in one run: the subdivided iterates equal plain ones (the test above), and the
    # class weights reach the subdivided step as they reach a plain one (tests/test_weights.py).
    [(1, None), (5, {0: 2.5})],
    ids=["plain", "subdivided-class-weighted"],
)
def test_logistic_regression_meets_scikit_learn(
    tmp_path: Path, subdivisions: int, class_weight: dict[int, float] | None
) -> None:
    x, y = standardized_breast_cancer()
    reference = LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000, class_weight=class_weight).fit(x, y)
    # float32's gradients round at the solution, over a Hessian whose smallest eigenvalue is 1.8e-3: a bound of
    # 1.3e-5 to 2.2e-5 (docs/benchmarks-lbfgs.md measured 1.2e-6, 5.8e-6 and 5.4e-6 on one CPU).
    sample_weight = np.where(y == 0, 2.5, 1.0) if class_weight else None
    solution = np.concatenate([reference.coef_[0], reference.intercept_])
    tolerance = amplified_rounding(*logistic_terms(solution, sample_weight))
    assert 1e-5 < tolerance < 3e-5
    # scikit-learn's C is l2 = 1 / (2 C N) on the mean loss; its class weights multiply each sample's loss as ours.
    training = {"subdivisions": subdivisions, "class_weight": {str(k): v for k, v in (class_weight or {}).items()}}
    config = table_config(
        write_csv(tmp_path / "cancer.csv", x, y),
        tmp_path / "run",
        task="binary",
        epochs=2 * int(reference.n_iter_[0]),  # at most twice scikit-learn's iterations
        l2=1 / (2 * len(x)),
        training={key: value for key, value in training.items() if value},
        optimizer={"tolerance_grad": 0.0, "tolerance_change": 0.0},
    )
    result = train(config, quiet=True)
    kernel, bias = result.model.get_weights()
    np.testing.assert_allclose(kernel[:, 0], reference.coef_[0], rtol=0, atol=tolerance)
    np.testing.assert_allclose(bias, reference.intercept_, rtol=0, atol=tolerance)
    rows = result.metrics
    assert [row["optimizer_steps"] for row in rows] == list(range(1, len(rows) + 1))
    assert all(row["evaluations"] >= 1 and row["step_length"] > 0 for row in rows)


@pytest.mark.slow
def test_least_squares_meets_the_closed_form_and_stops_converged(tmp_path: Path) -> None:
    x, y = load_diabetes(return_X_y=True)
    x, y = (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()
    solution = np.linalg.lstsq(np.hstack([x, np.ones((len(x), 1))]), y, rcond=None)[0]
    config = table_config(write_csv(tmp_path / "diabetes.csv", x, y), tmp_path / "run", task="regression", epochs=200)
    result = train(config, quiet=True)
    kernel, bias = result.model.get_weights()
    # The mean squared error's terms 2 r_i x_i and Hessian 2 X'X / N bound float32's rounding at the solution.
    rows = np.hstack([x, np.ones((len(x), 1))])
    tolerance = amplified_rounding(2 * (rows @ solution - y)[:, None] * rows, 2 * rows.T @ rows / len(x))
    assert 1e-5 < tolerance < 4e-5
    np.testing.assert_allclose(kernel[:, 0], solution[:-1], rtol=0, atol=tolerance)
    np.testing.assert_allclose(bias, solution[-1:], rtol=0, atol=tolerance)
    # It stops on its own, long before the epochs run out, and says why in its last row and in run.json.
    last = result.metrics[-1]
    assert last["epoch"] < 100 and last["stopped"].startswith("L-BFGS converged")
    assert run_json(result.run_dir)["status"] == "completed"
    assert run_json(result.run_dir)["reason"] == last["stopped"]
    # The row is the accepted point's: its loss is what the final model scores on the training data, two float32
    # computations of one mean apart.
    scored = evaluate(result.run_dir, "train")
    weights = np.concatenate([kernel[:, 0], bias]).astype(np.float64)
    rounding = mean_square_rounding(rows, weights, y)
    assert 1e-6 < rounding / last["loss"] < 1e-4  # some hundred float32 roundings of the loss: a bound that can fail
    assert abs(scored["loss"] - last["loss"]) <= 2 * rounding


@pytest.mark.slow
@pytest.mark.parametrize("most", [1, 2, 6])
def test_max_evaluations_ends_the_run_with_the_reason(tmp_path: Path, most: int) -> None:
    x, y = standardized_breast_cancer()
    config = table_config(
        write_csv(tmp_path / "cancer.csv", x[:100], y[:100]),
        tmp_path / "run",
        task="binary",
        epochs=50,
        optimizer={"max_evaluations": most},
    )
    rows = train(config, quiet=True).metrics
    # Never one more: a line search cut short by the limit reports the weights' last evaluation, not a new one.
    assert sum(row["evaluations"] for row in rows) == most
    assert rows[-1]["stopped"] == f"L-BFGS stopped: max_evaluations ({most}) reached"


@pytest.mark.slow
def test_adam_then_lbfgs_from_the_saved_model_with_dropout_off(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = {"name": "synthetic", "samples": 64, "shape": [3], "task": "regression", "validation_split": 0.0}
    model = {"name": "mlp", "hidden": [16], "activation": "tanh", "dropout": 0.2}
    adam = train(
        {
            "seed": 2,
            "data": data,
            "model": model,
            "loss": {"name": "mean_squared_error"},
            "training": {"epochs": 20, "batch_size": "full"},
            "optimizer": {"name": "adam", "learning_rate": 0.01},
            "output": {"tensorboard": False},
        },
        tmp_path / "adam",
        quiet=True,
    )
    polish = {
        "seed": 2,
        "data": data,
        "model": {"name": "saved", "path": str(tmp_path / "adam" / "model.keras")},
        "loss": {"name": "mean_squared_error"},
        "training": {"epochs": 15, "batch_size": "full", "subdivisions": 3},
        "optimizer": {"name": "lbfgs"},
        "output": {"tensorboard": False},
    }
    capsys.readouterr()
    rows = train(polish, tmp_path / "lbfgs").metrics
    # The layer's name is Keras' own, numbered by how many came before it in this process.
    assert re.search(r"random layers off for L-BFGS \(dropout(_\d+)? \(Dropout\)\)", capsys.readouterr().out)
    # It starts where Adam ended (scored without dropout), and every accepted point lowers the objective (within
    # the float32 rounding that the approximate Wolfe test allows: NOISE of the value where its search started).
    start = evaluate(adam.run_dir, "train")["loss"]
    losses = [row["loss"] for row in rows]
    assert losses[0] < start and all(b <= a * (1 + NOISE) for a, b in zip(losses, losses[1:], strict=False))
    assert losses[-1] < 0.5 * start
