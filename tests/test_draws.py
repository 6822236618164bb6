"""Randomness per sample: dropout and noise layers draw each sample's masks from the seed, the layer, the update
and the sample's row alone, so subdivided training equals plain training with them, streamed or not, across a
Ctrl-C and a resume; the draws themselves are sound; and a layer whose randomness accumrun does not know is
named.

One end-to-end run with dropout (plain against S=3, both through ``train``) and the two resumes; every other
comparison is a step-level one: the run's own model, optimizer and draws (``build_training``) stepped on the same
batches with and without subdivisions.

Tolerance of subdivided against plain training (2e-5): both take the same SGD updates from the same weights with the
same masks (the draws are exact: the tests of the draws compare them bit for bit); they differ only in the order of
float32 sums. A gradient entry is the mean of at most n = 13 per-sample terms (the batch), each an input of a few
units at most, scaled by at most 1 / (1 - 0.5) = 2 by a mask, times a backpropagated softmax residual below 1 through
small weights: their magnitudes average below 1 here. Higham's bound on a sum of n terms, n * 2^-24 times the sum of
their magnitudes, puts the mean within 13 * 6e-8 * 1 = 8e-7 of its exact value in either order. An update moves a
weight by the learning rate (at most 0.5) times that, 4e-7. Over at most 6 updates these add, and each update carries
the earlier difference on through the gradient, times at most 1 + rate * L, with L the gradient's Lipschitz constant
(softmax cross-entropy's curvature, at most 1/2 per logit, times the squared sizes of the small weights and inputs it
passes through: below 0.4 on these shallow models), so (1.2)^6 < 3: 6 * 4e-7 * 3 = 7e-6, and 2e-5 leaves a factor 3.
"""

from __future__ import annotations

import itertools
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
from accumrun.core.step import make_train_step
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.core.targets import as_targets
from accumrun.errors import Interrupted
from accumrun.kinds import Feed
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


def stepped(
    config: dict[str, Any], subdivisions: int, batches: list[tuple[np.ndarray, np.ndarray]], **fields: Any
) -> list[np.ndarray]:
    """The weights of ``config``'s model (its seeded start, its draws as a run sets them up) after one update per
    batch of ``batches`` with ``subdivisions``; ``fields`` replace the step's options (``feed=Feed.SUB_BATCH``
    streams each batch in the sub-batches the whole-batch step would cut)."""
    setup = build_training(load_config(config))
    trained = setup.trained
    spec = setup.stepped.step_spec(subdivisions)
    step = make_train_step(trained.model, trained.objective.objective, trained.optimizer, spec, **fields)
    for x, y in batches:
        if fields.get("feed") is Feed.SUB_BATCH:
            bounds = np.cumsum([0, *sub_batch_sizes(len(x), subdivisions)])
            parts = [(tf.constant(x[a:b]), as_targets(y[a:b], None)) for a, b in itertools.pairwise(bounds)]
            step.train_batch(parts, len(x))
        else:
            step(tf.constant(x), as_targets(y, None))
    return trained.model.get_weights()


def random_batches(count: int, size: int, shape: tuple[int, ...], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of ``size`` standard normal samples of ``shape`` in 3 classes."""
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(size, *shape)).astype(np.float32), rng.integers(3, size=size).astype(np.int32))
        for _ in range(count)
    ]


def test_the_draws_are_sound() -> None:
    key = tf.constant([12, 34], tf.int64)
    rows = tf.range(1000, dtype=tf.int64)
    uniform = to_uniform(row_bits(key, rows, tf.constant([1000]))).numpy()  # 10^6 elements
    assert uniform.shape == (1000, 1000) and uniform.min() >= 0.0 and uniform.max() < 1.0
    # Sound draws are independent, so each statistic below is within a few standard errors of its value; the bounds
    # are over 10 of them (a chance below 1e-20), where a flaw such as a biased or repeating stream shows by far more.
    # The kept fraction: 10^6 Bernoulli(0.7) draws, standard error sqrt(0.7 * 0.3 / 10^6) = 4.6e-4.
    assert abs(np.mean(uniform >= 0.3) - 0.7) < 0.007
    normal = to_normal(row_bits(key, rows, tf.constant([1000]))).numpy()
    # Standard errors 1 / sqrt(10^6) = 1e-3 of the mean and 1 / sqrt(2 * 10^6) = 7e-4 of the standard deviation.
    assert abs(normal.mean()) < 0.01 and abs(normal.std() - 1.0) < 0.01
    # Each row is its own: no two of the 1000 rows share their first 32 draws, and a row is the same asked alone.
    assert len({tuple(row[:32]) for row in uniform}) == 1000
    alone = to_uniform(row_bits(key, tf.constant([417], tf.int64), tf.constant([1000]))).numpy()
    np.testing.assert_array_equal(alone[0], uniform[417])
    other_key = to_uniform(row_bits(tf.constant([12, 35], tf.int64), rows, tf.constant([1000]))).numpy()
    # Independent draws of 2^24 float32 values agree with chance 6e-8: about 0.06 of 10^6, not 1000.
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
    # One sample in two updates: independent masks of rate 0.5 agree on 2000 elements in half of them, standard
    # error sqrt(0.25 / 2000) = 0.011, so 0.75 is over 20 of them away; the same masks would agree on all.
    assert np.mean(masks(0, 10).numpy() == whole) < 0.75
    assert np.array_equal(model(tf.ones((2, 200)), training=False).numpy(), np.ones((2, 200)))


@pytest.mark.slow
def test_subdivided_training_with_dropout_equals_plain_training(trained: Trained) -> None:
    # The end-to-end run with dropout: S=3 (4/3/3) through train(), to the plain run's weights (the tolerance: top).
    plain = trained("plain", dropout_config())
    assert plain.metrics[-1]["optimizer_steps"] == 6
    result = trained("S=3 (4/3/3)", dropout_config(subdivisions=3))
    assert max_difference(result.model.get_weights(), plain.model.get_weights()) < 2e-5
    assert max_difference(plain.model.get_weights(), stepped(dropout_config(), 1, [])) > 1e-2  # it trained


@pytest.mark.slow
def test_streamed_sub_batches_with_dropout_equal_plain_steps() -> None:
    # Another cut (3/3/2/2), each sub-batch fed by itself: three updates of the run's model, to the plain step's.
    batches = random_batches(3, 10, (6,))
    plain = stepped(dropout_config(), 1, batches)
    streamed = stepped(dropout_config(), 4, batches, feed=Feed.SUB_BATCH)
    assert max_difference(streamed, plain) < 2e-5
    assert max_difference(plain, stepped(dropout_config(), 1, [])) > 1e-2  # it trained
    # The control: drawn per sub-batch, as accumrun did before, S=3 parts from S=1 with the same draws.
    old = dropout_config(random_draws="per_sub_batch")
    assert max_difference(stepped(old, 3, batches), stepped(old, 1, batches)) > 1e-2


@pytest.mark.slow
def test_every_known_random_layer_draws_per_sample_attention_dropout_included() -> None:
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
    # Four updates on batches of 13 (4/3/3/3 with S=4), as the two epochs of the run would take them.
    batches = random_batches(4, 13, (4, 4, 2))
    plain = stepped(config, 1, batches)
    assert max_difference(stepped(config, 4, batches), plain) < 2e-5
    assert max_difference(plain, setup.trained.model.get_weights()) > 1e-2  # it trained


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
    assert [type(layer).__name__ for layer in build_training(load_config(config)).stepped.draws.per_sample_layers] == [
        "Dropout"
    ]
    batches = random_batches(3, 10, (6,))
    plain = stepped(config, 1, batches)
    assert max_difference(stepped(config, 3, batches), plain) < 2e-5
    assert max_difference(plain, stepped(config, 1, [])) > 1e-2  # it trained
