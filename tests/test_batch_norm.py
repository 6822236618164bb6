"""BatchNorm under accumulation (``training.batch_norm``): per-batch moving statistics equal plain training's
where they can, precise statistics are the training set's, frozen training equals plain training in every
weight, and ``sub_batch`` differs, as the control that lets the others fail.

The tolerances bound float32 sums taken in another order (Higham: a sum of n terms within n * 2^-24 = n * 6e-8 of
the sum of their magnitudes), on inputs of mean 3 and deviation 2 (5 and 3 for the precise statistics):
- a batch's moments from its sub-batches' sums (n = 10): the mean within 6e-7 of a mean magnitude of about 3, the
  second moment within 6e-7 of about 13 (8e-6); the moving statistics take 0.01 of them per update, so three updates
  stay within 3 * 0.01 * 8e-6 = 2.4e-7 of each other: 1e-6 (absolute, and relative to statistics near 1);
- the moving statistics after one update against the batch's exact (float64) moments: the mean's 6e-7 relative to
  its magnitude (within 1.1x of the mean here: the inputs are all but always positive), 7e-7, and the update's
  product and sum, 2 roundings of 6e-8: 8.2e-7, under 2e-6 relative;
- the weights, subdivided or streamed against whole batches: each gradient entry is a mean of 10 terms whose sizes
  average below 1 (normalized activations times a softmax residual below 1 through small weights), so within
  10 * 6e-8 = 6e-7 in either order; SGD at 0.1 moves a weight by 6e-8 of it per update, and three updates (the later
  ones carrying the earlier difference on, at most doubling it at this rate) stay below 3 * 2 * 6e-8 = 3.6e-7: 1e-6;
- the training set's statistics over 23 samples, in pieces of at most 4, against float64's: the mean within
  23 * 6e-8 = 1.4e-6 relative (all but positive inputs), the variance from second moments about 34 against a variance
  about 9, so within 1.4e-6 * 34 / 9 = 5.2e-6 relative: 1e-5.
"""

from __future__ import annotations

import functools
import itertools
import shutil
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from accumrun import kinds, load_config, train
from accumrun.config.loading import load_resume_config
from accumrun.core.batch_norm import BatchNormStatistics, PopulationStatistics
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.step import make_train_step
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.kinds import BatchNormMode, Feed
from accumrun.reports.compare import Variant, format_table
from accumrun.rundir.metrics import EpochRow
from accumrun.rundir.status import BatchNormNote
from accumrun.training.console import describe_setup
from accumrun.training.runner import RunResult
from accumrun.training.setup import build_training
from tests.helpers import max_difference, write_config

FEATURES, CLASSES = 4, 3


def bn_model(seed: int = 0) -> keras.Model:
    """A BatchNorm on the raw input (whose input no weight changes), a hidden layer with a BatchNorm after it."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    x = keras.layers.BatchNormalization(name="input_bn")(inputs)
    x = keras.layers.Dense(8, activation="relu")(x)
    x = keras.layers.BatchNormalization(name="hidden_bn")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(x))


def batches(count: int, size: int, seed: int = 1) -> list[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(seed)
    # Far from the initial statistics (mean 0, variance 1), so that their updates show.
    x = rng.normal(loc=3.0, scale=2.0, size=(count, size, FEATURES)).astype(np.float32)
    y = rng.integers(CLASSES, size=(count, size)).astype(np.int32)
    return [(tf.constant(a), tf.constant(b)) for a, b in zip(x, y, strict=True)]


def trained(mode: BatchNormMode, subdivisions: int, data: list[tuple[tf.Tensor, tf.Tensor]]) -> keras.Model:
    model = bn_model()
    statistics = BatchNormStatistics(model, mode)
    step = make_train_step(
        model, sparse_categorical_crossentropy, keras.optimizers.SGD(0.1), subdivisions, batch_norm=statistics
    )
    for x, y in data:
        step(x, y)
    return model


@functools.cache
def trained_on(mode: BatchNormMode, subdivisions: int, count: int, size: int) -> keras.Model:
    """:func:`trained` on ``batches(count, size)``, once per module for the tests that share it (read only)."""
    return trained(mode, subdivisions, batches(count, size))


def moving(model: keras.Model, name: str) -> np.ndarray:
    layer = model.get_layer(name)
    return np.concatenate([layer.moving_mean.numpy(), layer.moving_variance.numpy()])


@pytest.mark.slow
def test_per_batch_moves_an_input_batch_norm_as_plain_training_does_on_uneven_splits() -> None:
    data = batches(3, 10)  # 10 in 3 sub-batches of 3, 3 and 4
    plain = trained_on(BatchNormMode.PER_BATCH, 1, 3, 10)
    subdivided = trained_on(BatchNormMode.PER_BATCH, 3, 3, 10)
    np.testing.assert_allclose(moving(subdivided, "input_bn"), moving(plain, "input_bn"), rtol=1e-6, atol=1e-6)
    # The control: sub_batch moves them once per sub-batch, with a different result.
    darknet = trained(BatchNormMode.SUB_BATCH, 3, data)
    assert np.max(np.abs(moving(darknet, "input_bn") - moving(plain, "input_bn"))) > 1e-2


def test_per_batch_moves_the_statistics_by_the_whole_batch_moments_once() -> None:
    data = batches(1, 10)
    model = trained(BatchNormMode.PER_BATCH, 3, data)
    x = data[0][0].numpy().astype(np.float64)
    expected = np.concatenate([0.01 * x.mean(axis=0), 0.99 + 0.01 * x.var(axis=0)])
    np.testing.assert_allclose(moving(model, "input_bn"), expected, rtol=2e-6)


@pytest.mark.slow
def test_streamed_sub_batches_move_the_statistics_as_the_whole_batch_does() -> None:
    data = batches(3, 10)
    whole = trained_on(BatchNormMode.PER_BATCH, 3, 3, 10)
    model = bn_model()
    step = make_train_step(
        model,
        sparse_categorical_crossentropy,
        keras.optimizers.SGD(0.1),
        3,
        feed=Feed.SUB_BATCH,
        batch_norm=BatchNormStatistics(model, BatchNormMode.PER_BATCH),
    )
    starts = np.cumsum([0, *sub_batch_sizes(10, 3)])  # the sub-batches that the whole-batch step cuts
    for x, y in data:
        step.train_batch([(x[a:b], y[a:b]) for a, b in itertools.pairwise(starts)], 10)
    assert max_difference(model.get_weights(), whole.get_weights()) < 1e-6


def test_a_skipped_batch_leaves_the_statistics_as_they_were() -> None:
    model = bn_model()
    before = moving(model, "input_bn")
    step = make_train_step(
        model,
        sparse_categorical_crossentropy,
        keras.optimizers.SGD(0.1),
        2,
        batch_norm=BatchNormStatistics(model, BatchNormMode.PER_BATCH),
    )
    x, y = batches(1, 6)[0]
    applied = step(tf.tensor_scatter_nd_update(x, [[0, 0]], [np.nan]), y).applied
    assert not bool(applied)
    np.testing.assert_array_equal(moving(model, "input_bn"), before)


@pytest.mark.slow
def test_frozen_training_is_the_same_with_subdivisions_in_every_weight() -> None:
    data = batches(3, 10)
    plain = trained(BatchNormMode.FROZEN, 1, data)
    subdivided = trained(BatchNormMode.FROZEN, 3, data)
    assert max_difference(subdivided.get_weights(), plain.get_weights()) < 1e-6
    # Moving statistics fixed; gamma and beta trained.
    np.testing.assert_array_equal(moving(plain, "input_bn"), moving(bn_model(), "input_bn"))
    assert not np.allclose(plain.get_layer("input_bn").gamma.numpy(), 1.0)
    # The control: with statistics from each sub-batch, the weights differ.
    per_batch = [trained_on(BatchNormMode.PER_BATCH, subdivisions, 3, 10).get_weights() for subdivisions in (3, 1)]
    assert max_difference(*per_batch) > 1e-4


@pytest.mark.slow
def test_precise_statistics_are_the_training_set_mean_and_variance() -> None:
    model = bn_model()
    statistics = BatchNormStatistics(model, BatchNormMode.PRECISE)
    rng = np.random.default_rng(2)
    x = rng.normal(loc=5.0, scale=3.0, size=(23, FEATURES)).astype(np.float32)
    # Chunks of 10, 10 and 3, cut into pieces of at most 4: uneven everywhere.
    PopulationStatistics(model, statistics, piece=4)(tf.constant(x[i : i + 10]) for i in range(0, 23, 10))
    layer = model.get_layer("input_bn")
    exact = x.astype(np.float64)
    np.testing.assert_allclose(layer.moving_mean.numpy(), exact.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), exact.var(axis=0), rtol=1e-5)


def config_sections(tmp_path: Path, **training: Any) -> dict[str, Any]:
    return {
        "seed": 0,
        "data": {"name": "synthetic", "samples": 30, "shape": [6, 6, 1], "classes": 3, "validation_split": 0.2},
        "model": {"name": "darknet_cnn", "filters": [4, 8], "strides": [2, 2]},
        "training": {"epochs": 2, "batch_size": 8, "subdivisions": 2, **training},
        "output": {"tensorboard": False},
    }


def test_the_summary_counts_the_layers_and_warns_of_tiny_sub_batches(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bn.yaml", **config_sections(tmp_path, subdivisions=8))
    lines = describe_setup(build_training(load_config(path)))
    assert "batch norm: 2 BatchNormalization layers, per_batch (moving statistics move once per batch" in "\n".join(
        lines
    )
    warning = [line for line in lines if line.startswith("warning: BatchNorm")]
    assert warning and "sub-batch of 1 sample per replica" in warning[0] and "batch_norm: frozen" in warning[0]
    frozen = write_config(tmp_path / "frozen.yaml", **config_sections(tmp_path, subdivisions=8, batch_norm="frozen"))
    assert not any(line.startswith("warning") for line in describe_setup(build_training(load_config(frozen))))


@pytest.fixture(scope="module")
def precise_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], RunResult]:
    """Two epochs with precise statistics from 17 samples: the sections and the run, trained once for the tests
    that read it (read only)."""
    folder = tmp_path_factory.mktemp("precise")
    sections = config_sections(folder, batch_norm="precise", precise_bn_samples=17)
    return sections, train(sections, folder / "whole", quiet=True)


@pytest.mark.slow
def test_precise_training_resumes_to_the_same_weights(
    tmp_path: Path, precise_run: tuple[dict[str, Any], RunResult]
) -> None:
    sections, whole = precise_run
    first = {**sections, "training": {**sections["training"], "epochs": 1}}
    train(first, tmp_path / "resumed", quiet=True)
    resumed = train({**sections}, tmp_path / "resumed", resume=True, quiet=True)
    assert max_difference(resumed.model.get_weights(), whole.model.get_weights()) == 0.0
    assert resumed.metrics[-1]["val_loss"] == whole.metrics[-1]["val_loss"]


def test_compare_notes_a_batch_norm_model_unless_frozen(tmp_path: Path) -> None:
    row = {"epoch": 1, "loss": 0.5, "val_loss": 0.6, "seconds": 1.0, "samples_per_second": 10.0, "subdivisions": 4}
    rows = [EpochRow.from_json(row)]
    variants = [Variant(count, tmp_path / str(count), exit_code=0, metrics=rows) for count in (4, 1)]
    assert "note:" not in format_table(variants)
    variants[0].batch_norm = BatchNormNote(3, kinds.BatchNormMode.PER_BATCH)
    assert "note: the model has 3 BatchNorm layers (batch_norm: per_batch)" in format_table(variants)
    variants[0].batch_norm = BatchNormNote(3, kinds.BatchNormMode.FROZEN)
    assert "note:" not in format_table(variants)


@pytest.mark.slow
def test_a_run_from_before_batch_norm_modes_resumes_as_it_trained(
    tmp_path: Path, precise_run: tuple[dict[str, Any], RunResult]
) -> None:
    # A copy of a finished run (the precise one, trained once for the module), its config as older versions wrote it.
    _, whole = precise_run
    shutil.copytree(whole.run_dir, tmp_path / "run")
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    del saved["training"]["batch_norm"]  # as accumrun wrote it before the key existed
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved))
    assert load_resume_config(tmp_path / "run", None, ["training.epochs=3"]).training.batch_norm == "sub_batch"
    # A config that leaves the mode unset resumes with the run's.
    unset = write_config(tmp_path / "unset.yaml", **config_sections(tmp_path, precise_bn_samples=17))
    shutil.copytree(whole.run_dir, tmp_path / "precise")
    assert load_resume_config(tmp_path / "precise", str(unset), []).training.batch_norm == "precise"
