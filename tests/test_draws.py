"""Randomness per sample: dropout and noise layers draw each sample's masks from the seed, the layer, the update
and the sample's row alone, so subdivided training equals plain training with them, streamed or not, across a
Ctrl-C and a resume; the draws themselves are sound; and a layer whose randomness accumrun does not know is
named."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from accumrun import train
from accumrun.config.loading import load_config, load_resume_config
from accumrun.core.draws import row_bits, to_normal, to_uniform
from accumrun.core.seeds import LayerDraws
from accumrun.errors import Interrupted
from accumrun.training.console import describe_setup
from accumrun.training.setup import build_training
from tests.helpers import Trained, max_difference, signal_after_batch


def dropout_config(**training: Any) -> dict[str, Any]:
    """An MLP with dropout 0.5 on 30 training samples in batches of 10: 6 updates in 2 epochs; SGD, whose update
    shows a different mask as it is, where Adam's normalization could shrink it."""
    return {
        "seed": 4,
        "data": {"name": "synthetic", "samples": 33, "shape": [6], "classes": 3, "validation_split": 0.1},
        "model": {"name": "mlp", "hidden": [32], "dropout": 0.5},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": 1, **training},
        "optimizer": {"name": "sgd", "learning_rate": 0.5},
        "output": {"tensorboard": False},
    }


def test_the_draws_are_sound() -> None:
    key = tf.constant([12, 34], tf.int64)
    rows = tf.range(1000, dtype=tf.int64)
    uniform = to_uniform(row_bits(key, rows, tf.constant([1000]))).numpy()  # 10^6 elements
    assert uniform.shape == (1000, 1000) and uniform.min() >= 0.0 and uniform.max() < 1.0
    assert abs(np.mean(uniform >= 0.3) - 0.7) < 0.007  # the kept fraction, within 1% of 1 - rate
    normal = to_normal(row_bits(key, rows, tf.constant([1000]))).numpy()
    assert abs(normal.mean()) < 0.01 and abs(normal.std() - 1.0) < 0.01
    # Each row is its own: no two of the 1000 rows share their first 32 draws, and a row is the same asked alone.
    assert len({tuple(row[:32]) for row in uniform}) == 1000
    alone = to_uniform(row_bits(key, tf.constant([417], tf.int64), tf.constant([1000]))).numpy()
    np.testing.assert_array_equal(alone[0], uniform[417])
    other_key = to_uniform(row_bits(tf.constant([12, 35], tf.int64), rows, tf.constant([1000]))).numpy()
    assert np.mean(other_key == uniform) < 1e-3


def test_a_sample_gets_its_mask_from_its_row_and_the_update_alone() -> None:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((200,))
    model = keras.Model(inputs, keras.layers.Dropout(0.5)(inputs))
    updates = tf.Variable(0, dtype=tf.int64)
    draws = LayerDraws(model, updates)

    @tf.function
    def masks(first_row: int, rows: int) -> tf.Tensor:
        with draws.sub_batch(tf.constant(first_row), tf.constant(rows)):
            return model(tf.ones((rows, 200)), training=True)

    whole, tail = masks(0, 10).numpy(), masks(3, 7).numpy()
    np.testing.assert_array_equal(whole[3:], tail)  # the same samples, cut elsewhere: the same masks
    assert not np.array_equal(whole[0], whole[1])  # two samples of one batch
    assert set(np.unique(whole)) == {0.0, 2.0}  # kept values scaled by 1 / (1 - rate)
    updates.assign(1)
    assert np.mean(masks(0, 10).numpy() == whole) < 0.75  # one sample in two updates
    assert np.array_equal(model(tf.ones((2, 200)), training=False).numpy(), np.ones((2, 200)))


@pytest.mark.slow
def test_subdivided_training_with_dropout_equals_plain_training(trained: Trained) -> None:
    plain = trained("plain", dropout_config())
    assert plain.metrics[-1]["optimizer_steps"] == 6
    # Another cut (3/3/2/2) streamed one sub-batch per call: two runs, each way apart from plain.
    runs = {
        "S=3 (4/3/3)": dropout_config(subdivisions=3),
        "S=4 streamed": {**dropout_config(subdivisions=4), "data": {**dropout_config()["data"], "feed": "sub_batch"}},
    }
    for name, config in runs.items():
        result = trained(name, config)
        assert max_difference(result.model.get_weights(), plain.model.get_weights()) < 2e-5, name
    # The control: drawn per sub-batch, as accumrun did before, the same runs part.
    old_plain = trained("old-plain", dropout_config(random_draws="per_sub_batch"))
    old = trained("old", dropout_config(subdivisions=3, random_draws="per_sub_batch"))
    assert max_difference(old.model.get_weights(), old_plain.model.get_weights()) > 1e-2


@pytest.mark.slow
def test_every_known_random_layer_draws_per_sample_attention_dropout_included(tmp_path: Path) -> None:
    config = {
        "seed": 2,
        "data": {"name": "synthetic", "samples": 26, "shape": [4, 4, 2], "classes": 3, "validation_split": 0},
        "model": {"name": "tests.user_code:noisy_attention"},
        "training": {"epochs": 2, "batch_size": 13, "subdivisions": 1},
        "optimizer": {"name": "sgd", "learning_rate": 0.2},
        "output": {"tensorboard": False},
    }
    setup = build_training(load_config(config))
    kinds = [type(layer).__name__ for layer in setup.stepped.draws.per_sample_layers]
    # The third is MultiHeadAttention's own Dropout, on its attention scores.
    assert kinds == ["SpatialDropout2D", "GaussianNoise", "Dropout", "GaussianDropout", "AlphaDropout", "Dropout"]
    assert not setup.stepped.draws.other_layers
    (line,) = [line for line in describe_setup(setup) if "random layers" in line]
    assert line.startswith("random layers draw per sample (spatial_dropout2d")
    assert line.endswith(" and 2 more): subdivisions do not change them")
    plain = train(config, tmp_path / "plain", quiet=True)
    subdivided = train({**config, "training": {**config["training"], "subdivisions": 4}}, tmp_path / "s4", quiet=True)
    assert max_difference(subdivided.model.get_weights(), plain.model.get_weights()) < 2e-5
    assert max_difference(plain.model.get_weights(), setup.trained.model.get_weights()) > 1e-2  # it trained


def test_a_layer_with_randomness_of_its_own_is_named_at_startup() -> None:
    config = {**dropout_config(), "model": {"name": "tests.user_code:own_noise_mlp"}}
    lines = [line for line in describe_setup(build_training(load_config(config))) if "random" in line]
    assert re.fullmatch(
        r"random layers draw per sample \(dropout(_\d+)? \(Dropout\)\): subdivisions do not change them", lines[0]
    )
    assert re.fullmatch(
        r"own_noise(_\d+)? \(OwnNoise\) draws randomness accumrun does not know: drawn per sub-batch, so "
        r"subdivisions change the run \(exactness is not promised\)",
        lines[1],
    )


@pytest.mark.slow
def test_a_run_with_dropout_stopped_by_ctrl_c_resumes_to_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trained: Trained
) -> None:
    config = dropout_config(subdivisions=3)
    whole = trained("S=3 (4/3/3)", config)
    signal_after_batch(monkeypatch, 2)  # of 3 in epoch 1
    with pytest.raises(Interrupted):
        train(config, tmp_path / "run", quiet=True)
    monkeypatch.undo()
    resumed = train(load_resume_config(tmp_path / "run", None), tmp_path / "run", quiet=True, resume=True)
    assert max_difference(resumed.model.get_weights(), whole.model.get_weights()) == 0.0


@pytest.mark.slow
def test_a_run_from_before_per_sample_draws_resumes_with_the_draws_it_began_with(
    tmp_path: Path, trained: Trained
) -> None:
    old = dropout_config(subdivisions=3, random_draws="per_sub_batch")
    whole = trained("old", old)
    train({**old, "training": {**old["training"], "epochs": 1}}, tmp_path / "run", quiet=True)
    saved = tmp_path / "run" / "config.yaml"
    document = yaml.safe_load(saved.read_text())
    del document["training"]["random_draws"]  # as a run from before the key recorded it
    saved.write_text(yaml.safe_dump(document, sort_keys=False))

    config = load_resume_config(tmp_path / "run", None, ["training.epochs=2"])
    assert config.training.random_draws.value == "per_sub_batch"
    resumed = train(config, tmp_path / "run", quiet=True, resume=True)
    assert max_difference(resumed.model.get_weights(), whole.model.get_weights()) == 0.0


@pytest.mark.slow
def test_dropout_inside_a_saved_model_nested_in_another_draws_per_sample(tmp_path: Path) -> None:
    keras.utils.set_random_seed(3)
    inner = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16), keras.layers.Dropout(0.5)], name="inner")
    inputs = keras.Input((6,))
    keras.Model(inputs, keras.layers.Dense(3)(inner(inputs))).save(tmp_path / "nested.keras")
    config = {**dropout_config(), "model": {"name": "saved", "path": str(tmp_path / "nested.keras")}}
    plain = train(config, tmp_path / "plain", quiet=True)
    subdivided = train({**config, "training": {**config["training"], "subdivisions": 3}}, tmp_path / "s3", quiet=True)
    assert max_difference(subdivided.model.get_weights(), plain.model.get_weights()) < 2e-5
    assert [type(layer).__name__ for layer in build_training(load_config(config)).stepped.draws.per_sample_layers] == [
        "Dropout"
    ]
