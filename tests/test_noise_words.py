"""The gradient noise scale in words: what the closing line says it means for the batch, an epoch whose estimate is
undefined, the plot's panel, compare's lines per variant, check's note, and ``training.noise_scale_every``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from matplotlib.image import imread

from accumrun import train
from accumrun.config.loading import load_config
from accumrun.core.noise import GradientNoise
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.errors import ConfigError
from accumrun.reports.compare import Variant, format_table
from accumrun.reports.plot import plot_curves
from accumrun.rundir.metrics import EpochRow
from accumrun.training.measurements import measurement_lines
from accumrun.training.noise_scale import noise_scale_line
from accumrun.training.setup import build_training
from tests.helpers import contiguous, invoke, reference_estimates, tiny_config
from tests.test_measure import linear_regression_config, squared_error_gradients


def test_below_the_noise_scale_the_line_says_a_larger_batch_still_saves_updates() -> None:
    assert noise_scale_line(8, 626.2, 256.0, 256) == (
        "gradient noise scale ~626 samples at epoch 8: batch 256 is below it, so a batch of up to about 600 would "
        "still need nearly proportionally fewer updates (McCandlish et al. 2018)"
    )


def test_above_the_noise_scale_the_line_says_a_larger_batch_mostly_costs_compute() -> None:
    assert noise_scale_line(20, 1_800.0, 4_096.0, 4_096) == (
        "gradient noise scale ~1,800 samples at epoch 20: batch 4,096 is above it, so a larger batch would mostly "
        "cost compute, saving few updates (McCandlish et al. 2018)"
    )
    # A token-level objective's batch is its mean real tokens.
    assert noise_scale_line(3, 5_123.0, 20_480.0, None).startswith(
        "gradient noise scale ~5,123 tokens at epoch 3: batch ~20,480 is above it"
    )


def test_an_epoch_whose_estimate_is_not_positive_prints_n_a_with_the_reason() -> None:
    (part,) = measurement_lines({"loss": 1.0, "gradient_sq_norm": -0.02, "gradient_trace_cov": 3.0})
    assert part.startswith("noise scale n/a (the |G|^2 estimate is not positive")
    assert measurement_lines({"gradient_sq_norm": 0.5, "gradient_noise_scale": 1234.4}) == ["noise scale 1,234"]
    assert measurement_lines({"loss": 1.0}) == []


def rows(epochs: int, subdivisions: int, noise: bool) -> list[EpochRow]:
    figures: list[dict[str, float]] = [
        {"gradient_sq_norm": 0.5, "gradient_trace_cov": 30.0 * e, "gradient_noise_scale": 60.0 * e} if noise else {}
        for e in range(1, epochs + 1)
    ]
    return [
        EpochRow(epoch=e, loss=1.0 / e, figures=f, batch_size=128, subdivisions=subdivisions, seconds=1.0)
        for e, f in enumerate(figures, 1)
    ]


def test_compare_shows_the_noise_scale_per_variant_and_why_the_plain_one_has_none(tmp_path: Path) -> None:
    measured = Variant(4, tmp_path / "s4", exit_code=0, metrics=rows(3, 4, noise=True))
    plain = Variant(1, tmp_path / "s1", exit_code=0, metrics=rows(3, 1, noise=False))
    table = format_table([measured, plain])
    assert (
        "gradient noise scale (the last measured):\n"
        "  subdivisions 4: ~180 at epoch 3; batch 128 is below it\n"
        "  off (subdivisions 1): not measured: each batch is one sub-batch on one device" in table
    )
    # Nothing is said where no variant measured it.
    assert "noise scale" not in format_table([Variant(4, tmp_path / "a", exit_code=0, metrics=rows(2, 4, False))])


def test_the_plot_draws_the_noise_scale_beside_the_batch_size(tmp_path: Path) -> None:
    plain = [row.to_json() for row in rows(6, 4, noise=False)]
    measured = [row.to_json() for row in rows(6, 4, noise=True)]
    with_noise = imread(plot_curves({"S=4": measured}, tmp_path / "noise.png"))
    without = imread(plot_curves({"S=4": plain}, tmp_path / "loss.png"))
    # A panel more (the loss and the noise scale, 11 inches) than the loss alone (7 inches), at 120 dpi.
    assert (with_noise.shape[1], without.shape[1]) == (1320, 840)


@pytest.mark.slow
def test_check_says_when_the_noise_scale_will_not_be_measured_and_how_often_it_will(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tiny_config(tmp_path, training={"epochs": 1, "measure": ["noise_scale"]})
    plain = invoke("check", str(path), "--set", "training.subdivisions=1")
    assert plain.returncode == 0, plain.stderr
    assert "noise_scale is not measured: each batch is one sub-batch on one device (subdivisions 1)" in plain.stdout
    sparse = invoke("check", str(path), "--set", "training.subdivisions=2", "--set", "training.noise_scale_every=10")
    assert sparse.returncode == 0, sparse.stderr
    assert "noise_scale is measured on one update in every 10" in sparse.stdout
    assert "not measured" not in sparse.stdout


def test_noise_scale_every_is_refused_without_the_noise_scale(tmp_path: Path) -> None:
    path = linear_regression_config(tmp_path, 10, shuffle=False, epochs=1, noise_scale_every=3)
    with pytest.raises(ConfigError, match="training.noise_scale_every: applies to noise_scale; add it"):
        load_config(path, ["training.measure=[]"])


def test_the_observer_measures_the_updates_whose_index_every_divides() -> None:
    updates = tf.Variable(0, dtype=tf.int64)
    observer = GradientNoise(3, updates)
    gradients = [tf.constant([3.0, 4.0])]
    measured = []
    for index in range(7):
        updates.assign(index)
        measured.append(bool(observer.sub_batch(gradients, tf.constant(5.0))[1]))
    assert measured == [True, False, False, True, False, False, True]
    np.testing.assert_allclose(observer.sub_batch(gradients, tf.constant(5.0)).numpy(), [25.0 / 5.0, 1.0])


@pytest.mark.slow
def test_one_update_in_every_k_is_measured_and_logged_as_every_update_would_be(tmp_path: Path) -> None:
    # One full-batch update per epoch, in sub-batches of 3, 3 and 4: with K=2 the updates 0 and 2 (epochs 1 and 3)
    # are measured, and measuring moves nothing, so their figures are those of a run that measures every update.
    path = linear_regression_config(tmp_path, 10, shuffle=False, epochs=3, batch_size="full", subdivisions=3)
    every = train(load_config(path), tmp_path / "every", quiet=True).metrics
    sparse = train(load_config(path, ["training.noise_scale_every=2"]), tmp_path / "sparse", quiet=True).metrics
    for row, reference in zip(sparse, every, strict=True):
        assert row["loss"] == reference["loss"]
        if row["epoch"] % 2:
            for key in ("gradient_sq_norm", "gradient_trace_cov", "gradient_noise_scale"):
                assert row[key] == reference[key]
        else:
            assert not any(key.startswith("gradient_") for key in row)


def test_the_epochs_estimate_averages_its_measured_updates(tmp_path: Path) -> None:
    # Batches of 4 in two sub-batches of 2, in order: 5 updates per epoch, numbered 0-4 and 5-9. With K=3 the first
    # epoch measures updates 0 and 3, the second 6 and 9; each epoch's figures are the means of theirs. The
    # reference follows plain gradient descent in float64; as in test_measure, float32 agrees to 1e-5.
    path = linear_regression_config(tmp_path, 20, shuffle=False, epochs=2, batch_size=4, subdivisions=2)
    sparse = train(load_config(path, ["training.noise_scale_every=3"]), tmp_path / "sparse", quiet=True).metrics
    with np.load(tmp_path / "linear.npz") as arrays:
        x, y = arrays["x"].astype(np.float64), arrays["y"].astype(np.float64)
    weights = [w.numpy().astype(np.float64) for w in build_training(load_config(path)).trained.model.trainable_weights]
    estimates = []
    for update in range(10):
        rows = slice(4 * (update % 5), 4 * (update % 5) + 4)
        gradients = squared_error_gradients(weights, x[rows], y[rows])
        estimates.append(reference_estimates(gradients, contiguous(sub_batch_sizes(4, 2))))
        step = gradients.mean(axis=0)
        weights = [weights[0] - 0.05 * step[:3, None], weights[1] - 0.05 * step[3:]]
    for row, measured in zip(sparse, ([0, 3], [6, 9]), strict=True):
        sq_norm, trace = np.mean([estimates[k] for k in measured], axis=0)
        assert row["gradient_sq_norm"] == pytest.approx(sq_norm, rel=1e-5)
        assert row["gradient_trace_cov"] == pytest.approx(trace, rel=1e-5)
