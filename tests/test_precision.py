"""Mixed precision: float16 and bfloat16 compute, float32 logits and accumulators, loss scaling per batch."""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import train
from accumrun.config.loading import load_config
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.step import make_gradient_fn, make_train_step
from tests.helpers import dense_model, invoke, make_data, max_difference, tiny_config


@pytest.mark.parametrize(
    ("precision", "line"),
    [
        ("float32", None),
        ("mixed_bfloat16", "mixed_bfloat16: layers compute in bfloat16, variables stay float32"),
        ("mixed_float16", "mixed_float16: layers compute in float16 under a loss scale, variables stay float32"),
        ("float64", "float64: variables, sums, losses and metrics in float64"),
    ],
)
def test_the_startup_summary_names_a_precision_other_than_float32(tmp_path, precision: str, line: str | None) -> None:
    result = invoke("check", str(tiny_config(tmp_path, training={"precision": precision})))
    assert result.returncode == 0, result.stderr
    named = [printed for printed in result.stdout.splitlines() if printed.startswith("precision ")]
    assert named == ([] if line is None else [f"precision {line}"])


def mixed_model(policy: str) -> keras.Model:
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        return dense_model()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_runs_train_with_float32_logits(tmp_path, precision: str) -> None:
    path = tiny_config(tmp_path, training={"epochs": 4, "precision": precision}, optimizer={"learning_rate": 0.05})
    result = train(load_config(path), tmp_path / "run", quiet=True)
    losses = [row["loss"] for row in result.metrics]
    assert losses[-1] < losses[0] * 0.8
    assert result.model.layers[1].dtype_policy.name == precision
    assert result.model.layers[-1].compute_dtype == "float32"
    assert keras.mixed_precision.dtype_policy().name == "float32", "the global policy must be restored"
    if precision == "mixed_float16":
        assert all(row["loss_scale_skips"] == 0 for row in result.metrics)


def test_accumulators_are_float32_under_float16_compute() -> None:
    model = mixed_model("mixed_float16")
    x, y = make_data(10)
    gradients, _, _ = make_gradient_fn(model, sparse_categorical_crossentropy, 3)(tf.constant(x), tf.constant(y))
    assert {g.dtype for g in gradients} == {tf.float32}


def float16_weights(subdivisions: int) -> list[np.ndarray]:
    model = mixed_model("mixed_float16")
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.02))
    step = make_train_step(model, sparse_categorical_crossentropy, optimizer, subdivisions)
    x, y = make_data(23)
    for _ in range(2):
        for start in range(0, 23, 10):
            applied = step(tf.constant(x[start : start + 10]), tf.constant(y[start : start + 10])).applied
            assert bool(applied)
    return [v.numpy() for v in model.trainable_variables]


@functools.cache
def plain_float16_weights() -> tuple[np.ndarray, ...]:
    """:func:`float16_weights` of one sub-batch, trained once for the tests that compare to it."""
    return tuple(float16_weights(1))


@pytest.mark.slow
@pytest.mark.parametrize("subdivisions", [3, 4])
def test_subdivided_float16_training_equals_float16_training(subdivisions: int) -> None:
    reference = plain_float16_weights()
    weights = float16_weights(subdivisions)
    # float16 rounds activations to ~3 decimal digits; the update must still agree to that precision.
    assert max_difference(reference, weights) < 2e-3
    assert max_difference(reference, [v.numpy() for v in dense_model().trainable_variables]) > 1e-2


def test_an_overflowing_loss_scale_skips_the_update_and_lowers_the_scale() -> None:
    model = mixed_model("mixed_float16")
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1e30)
    step = make_train_step(model, sparse_categorical_crossentropy, optimizer, 3)
    x, y = make_data(10)
    before = [v.numpy() for v in model.trainable_variables]
    result = step(tf.constant(x), tf.constant(y))
    assert np.isfinite(float(result.loss_sum)) and not bool(result.applied)
    assert int(optimizer.iterations.numpy()) == 0 and float(optimizer.dynamic_scale.numpy()) == pytest.approx(5e29)
    assert max_difference(before, [v.numpy() for v in model.trainable_variables]) == 0
