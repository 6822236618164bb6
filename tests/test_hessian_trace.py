"""``training.measure: [hessian_trace]``: Hutchinson's estimate of the training objective's Hessian trace against the
dense Hessian's, and the same value whatever the sub-batches and across a resume."""

from __future__ import annotations

import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import train
from accumrun.config.loading import load_config, load_resume_config
from accumrun.core.hessian import HessianVectorProducts, hutchinson_trace
from accumrun.core.losses import Objective, sparse_categorical_crossentropy
from accumrun.errors import ConfigError
from accumrun.training.setup import build_training
from tests.helpers import write_config
from tests.test_measure import dense_hessian


def test_the_estimate_is_within_four_standard_errors_of_the_dense_trace() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = rng.integers(3, size=40).astype(np.int32)
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh"), keras.layers.Dense(3)])
    objective = Objective(sparse_categorical_crossentropy)

    # In uneven chunks of 15 samples (the last of 10), as sub-batches.
    def chunks() -> list[tuple[tf.Tensor, tf.Tensor]]:
        return [(tf.constant(x[a : a + 15]), tf.constant(y[a : a + 15])) for a in range(0, 40, 15)]

    products = HessianVectorProducts(model, objective, chunks)
    trace, error = hutchinson_trace(products, products.dimension, vectors=50, seed=[0, 3])
    expected = np.trace(dense_hessian(model, objective, x, y))
    assert 0 < error < 0.5 * abs(expected)
    assert abs(trace - expected) < 4 * error


@pytest.mark.slow
def test_a_run_logs_the_same_trace_for_any_sub_batches_and_after_a_resume(tmp_path: Path) -> None:
    # 30 samples, all for training, one full-batch update per epoch by gradient descent; measured after epochs 2
    # and 4.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4)).astype(np.float32)
    y = rng.integers(3, size=30).astype(np.int32)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    path = write_config(
        tmp_path / "trace.yaml",
        seed=1,
        data={"name": "npz", "path": str(tmp_path / "data.npz"), "validation_split": 0.0, "shuffle": False},
        model={"name": "mlp", "hidden": [8], "activation": "tanh"},
        training={
            "epochs": 4,
            "batch_size": "full",
            "subdivisions": 4,
            "measure": ["hessian_trace"],
            "measure_every": 2,
            "trace_vectors": 30,
        },
        optimizer={"name": "sgd", "learning_rate": 0.5},
        output={"tensorboard": False},
    )
    reference = train(load_config(path), tmp_path / "S=4", quiet=True)
    # S=1 in two sessions: 2 epochs, then resumed to 4. Other vectors would move the estimate by about its standard
    # error, far beyond the tolerance, so this holds the subdivisions and the resume apart from the draws.
    train(load_config(path, ["training.subdivisions=1", "training.epochs=2"]), tmp_path / "S=1", quiet=True)
    extended = load_resume_config(tmp_path / "S=1", None, ["training.epochs=4"])
    resumed = train(extended, tmp_path / "S=1", quiet=True, resume=True)

    def traces(rows: list[dict[str, float]]) -> list[tuple[float, float]]:
        return [(row["hessian_trace"], row["hessian_trace_error"]) for row in rows if "hessian_trace" in row]

    assert ["hessian_trace" in row for row in reference.metrics] == [False, True, False, True]
    assert ["hessian_trace" in row for row in resumed.metrics] == [False, True, False, True]
    for mine, theirs in zip(traces(resumed.metrics), traces(reference.metrics), strict=True):
        assert mine == pytest.approx(theirs, rel=1e-5)

    # The last measurement is at the final weights: against their dense Hessian.
    setup = build_training(load_config(path))
    setup.trained.model.set_weights(reference.model.get_weights())
    expected = np.trace(dense_hessian(setup.trained.model, setup.trained.objective.objective, x, y))
    trace, error = traces(reference.metrics)[-1]
    assert abs(trace - expected) < 4 * error


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["training.measure=[noise_scale]", "training.trace_vectors=20"],
            "training.trace_vectors: applies to hessian_trace; add it to training.measure (got 20)",
        ),
        (
            ["training.measure=[hessian_trace]", "distribute.strategy=mirrored"],
            "training.measure: hessian_trace is measured on one device, not with distribute.strategy: mirrored "
            "(got 'hessian_trace')",
        ),
        (["training.measure=[hessian_trace]", "training.trace_vectors=1"], "training.trace_vectors: input should be"),
    ],
)
def test_what_the_trace_declares_is_refused_from_its_declarations(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config({"data": {"name": "digits"}}, overrides)
