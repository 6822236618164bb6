"""``training.remat``: recomputing activations in the backward pass never changes a number.

One contract over the modes: the weights after a few SGD updates with remat equal those without, with dropout on
(each sample's masks are drawn again identically, which the control shows matters) and BatchNorm in each mode whose
moving statistics move (they must move once, however often their layer runs); the recomputation really happens;
``blocks`` finds each kind's blocks (the built-in transformer's, residual ones, a Keras application's, a KerasHub
backbone's) or is refused in one line; ``auto`` without a memory budget is ``none``; remat composes with mixed
precision, with replicas, and with LoRA over an int8 base on replicas; and a run configured with it trains as one
without.

The tolerance: a recomputed block runs the same operations on the same inputs, so its forward pass is the same
to the bit; its gradient comes from a second tape over it, whose sums may run in another order, which moves a
float32 gradient by a few units in the last place (2.2e-7 relative was measured over two Dense layers). Over
``UPDATES`` SGD updates of rate ``RATE`` on gradients below ``1`` in size here, each weight moves apart by at most
about ``UPDATES * RATE * 1 * 4 * 1.2e-7`` (1e-7), which with the propagation through the later update stays well
below 1e-5, the issue's bound.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun.config.loading import load_config
from accumrun.config.remat import settle_remat
from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.seeds import LayerDraws
from accumrun.core.step import make_train_step
from accumrun.errors import ConfigError, ConfigProblems
from accumrun.kinds import BatchNormMode, Remat
from accumrun.models.blocks import hub_blocks, residual_blocks, transformer_blocks
from accumrun.models.lora import adapt
from accumrun.models.remat import apply_remat
from accumrun.models.transformer import transformer
from accumrun.models.transformer_kind import TransformerConfig
from tests.helpers import write_config
from tests.lora_models import LORA

UPDATES, RATE, TOLERANCE = 2, 0.1, 1e-5
LORA_INT8 = {"name": "transformer", "lora": LORA, "quantize": "int8"}
SAMPLES, SUB_BATCHES = 4, 2
FEATURES, CLASSES, LENGTH, VOCABULARY = 6, 3, 4, 8


def mlp() -> keras.Model:
    inputs = keras.Input((FEATURES,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Dropout(0.3)(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(x))


def residual() -> keras.Model:
    """Two residual blocks (Dense, BatchNorm, dropout, Dense, added to the skip), as a Keras application has them."""
    inputs = keras.Input((FEATURES,))
    x = keras.layers.Dense(8)(inputs)
    for _ in range(2):
        h = keras.layers.Dense(8, activation="relu")(x)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.Dropout(0.3)(h)
        x = keras.layers.Add()([x, keras.layers.Dense(8)(h)])
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(x))


def built_in_transformer(layers: int = 1) -> keras.Model:
    return transformer((LENGTH,), VOCABULARY, VOCABULARY, layers=layers, heads=2, width=8, dropout=0.3, causal=True)


def hub_gpt2() -> keras.Model:
    """A tiny KerasHub GPT-2 backbone with a head of logits at every position, built as accumrun builds it."""
    from accumrun.models.hub import KerasHubConfig, keras_hub_model

    section = KerasHubConfig.model_validate(
        {"name": "keras_hub.models.GPT2Backbone", "num_layers": 2, "num_heads": 2, "hidden_dim": 8,
         "intermediate_dim": 16, "dropout": 0.3}
    )  # fmt: skip
    return keras_hub_model(section, (LENGTH,), VOCABULARY, VOCABULARY, per_position=True, any_length=False)


def mobilenet() -> keras.Model:
    """``keras.applications.MobileNetV2`` (width 0.35, random weights) at 32x32 with a new head: 10 residual
    blocks, BatchNorm in each."""
    base = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None, include_top=False, pooling="avg"
    )
    inputs = keras.Input((32, 32, 3))
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(base(inputs)))


KINDS: dict[str, tuple[Callable[[], keras.Model], Callable[[keras.Model], list[Any]], bool]] = {
    "transformer": (built_in_transformer, transformer_blocks, True),
    "residual": (residual, residual_blocks, False),
}
"""The kinds trained here: how each is made, how its blocks are found, whether it reads token ids. The built-in
transformer is the cheapest model with blocks (and dropout); the residual one has BatchNorm inside its blocks."""


def batches(tokens: bool) -> list[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(1)
    if tokens:
        return [
            (tf.constant(rng.integers(1, VOCABULARY, (SAMPLES, LENGTH)), tf.int32),
             tf.constant(rng.integers(1, VOCABULARY, (SAMPLES, LENGTH)), tf.int32))
            for _ in range(UPDATES)
        ]  # fmt: skip
    return [
        (tf.constant(rng.normal(2.0, 1.5, (SAMPLES, FEATURES)), tf.float32),
         tf.constant(rng.integers(CLASSES, size=SAMPLES)))
        for _ in range(UPDATES)
    ]  # fmt: skip


def weights_after(
    kind: str,
    remat: Remat,
    batch_norm: BatchNormMode = BatchNormMode.PER_BATCH,
    strategy: tf.distribute.Strategy | None = None,
    *,
    lora_int8: bool = False,
) -> dict[str, np.ndarray]:
    """Every weight (moving statistics too), by its path, after ``UPDATES`` SGD updates in ``SUB_BATCHES``
    sub-batches with per-sample draws, each batch dealt out to the replicas of ``strategy`` where one is given; with
    ``lora_int8``, the model's base held in int8 and LoRA's adapters trained over it, as ``model.lora`` and
    ``model.quantize`` make a run's model."""
    make, find_blocks, tokens = KINDS[kind]
    keras.utils.set_random_seed(0)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = make()
        if lora_int8:
            adapt(model, TransformerConfig.model_validate(LORA_INT8), attention=True)
        apply_remat(model, remat, find_blocks)
        optimizer = keras.optimizers.SGD(RATE)
        optimizer.build(model.trainable_variables)
    step = make_train_step(
        model,
        sparse_categorical_crossentropy,
        optimizer,
        SUB_BATCHES,
        batch_norm=BatchNormStatistics(model, batch_norm),
        draws=LayerDraws(model, optimizer.iterations),
        strategy=strategy,
    )
    for x, y in batches(tokens):
        step(x, y)
    return named_weights(model)


@functools.cache
def weights_without(kind: str, batch_norm: BatchNormMode = BatchNormMode.PER_BATCH) -> dict[str, np.ndarray]:
    """:func:`weights_after` without remat, once per module for the tests that compare with it (read only)."""
    return weights_after(kind, Remat.NONE, batch_norm)


def named_weights(model: keras.Model) -> dict[str, np.ndarray]:
    named = {variable.path: np.array(variable) for variable in model.weights}
    assert len(named) == len(model.weights), "two weights share a path"
    return named


def largest_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Over the weights in the models' order (Keras numbers the layers of each new model on, so names differ)."""
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a.values(), b.values(), strict=True))


def assert_remat_trains_the_same_weights(
    kind: str, remat: Remat, batch_norm: BatchNormMode, recomputations: list[int]
) -> None:
    without = weights_without(kind, batch_norm)
    recomputations.clear()
    assert largest_difference(weights_after(kind, remat, batch_norm), without) <= TOLERANCE
    if remat is not Remat.ACTIVATIONS:  # Keras' mode recomputes through Keras' own tf.recompute_grad
        assert recomputations and set(recomputations) == {2}  # each call ran again in the backward pass


@pytest.mark.slow
@pytest.mark.parametrize("remat", [Remat.ACTIVATIONS, Remat.BLOCKS, Remat.LAYERS], ids=str)
def test_remat_trains_the_same_weights(remat: Remat, recomputations: list[int]) -> None:
    """Each mode on the built-in transformer, its dropout on: the same weights, and the calls really recomputed."""
    assert_remat_trains_the_same_weights("transformer", remat, BatchNormMode.PER_BATCH, recomputations)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("remat", "batch_norm"),
    [
        (Remat.BLOCKS, BatchNormMode.PER_BATCH),
        (Remat.BLOCKS, BatchNormMode.PRECISE),
        (Remat.BLOCKS, BatchNormMode.SUB_BATCH),
        (Remat.LAYERS, BatchNormMode.SUB_BATCH),
    ],
    ids=str,
)
def test_batch_norm_statistics_move_once_under_remat(
    remat: Remat, batch_norm: BatchNormMode, recomputations: list[int]
) -> None:
    """BatchNorm inside recomputed blocks, in each mode whose moving statistics move (``frozen``'s never do): once
    per batch from the batch's moments, or in each sub-batch's own call (``sub_batch``, where ``layers`` also wraps
    the BatchNorm layer's call), never again in the backward pass."""
    assert_remat_trains_the_same_weights("residual", remat, batch_norm, recomputations)


@pytest.mark.slow
def test_the_draws_are_replayed_not_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a recomputation that draws its dropout masks anew trains other weights."""
    without = weights_without("transformer")
    monkeypatch.setattr(LayerDraws, "_replay_point", lambda self: contextlib.nullcontext)
    assert largest_difference(weights_after("transformer", Remat.BLOCKS), without) > 1e-3


@pytest.mark.slow
def test_remat_composes_with_mixed_precision() -> None:
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        without = weights_after("residual", Remat.NONE)
        with_remat = weights_after("residual", Remat.BLOCKS)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    # The same bound: the variables are float32, and the recomputed bfloat16 forward pass is the same to the bit.
    assert largest_difference(with_remat, without) <= TOLERANCE


@pytest.mark.slow
def test_remat_composes_with_replicas(mirrored_strategy: tf.distribute.Strategy) -> None:
    """The transformer's blocks recomputed inside each replica's sub-batches: the same weights as on one device
    without remat. The same bound holds: each replica's recomputed forward pass is the same to the bit, and summing
    the replicas' gradients reorders float32 sums as the second tape does (a few units in the last place)."""
    with_remat = weights_after("transformer", Remat.BLOCKS, strategy=mirrored_strategy)
    assert largest_difference(with_remat, weights_without("transformer")) <= TOLERANCE


@pytest.mark.slow
def test_remat_composes_with_an_int8_lora_base_on_replicas(mirrored_strategy: tf.distribute.Strategy) -> None:
    """LoRA over the transformer's int8 base, every layer recomputed (each int8 layer's deferred backward pass
    inside its recomputation) in each replica's sub-batches: the adapters as on one device without remat, within
    the same bound, and moved by training (each ``B`` starts at zero)."""
    with_remat = weights_after("transformer", Remat.LAYERS, mirrored_strategy, lora_int8=True)
    without = weights_after("transformer", Remat.NONE, lora_int8=True)
    assert largest_difference(with_remat, without) <= TOLERANCE
    moved = [np.max(np.abs(weights)) for path, weights in without.items() if path.endswith("lora_kernel_b")]
    assert len(moved) == 2 and min(moved) > 1e-3  # the attention's query and value


def test_blocks_are_found_per_kind() -> None:
    keras.utils.set_random_seed(0)
    assert len(transformer_blocks(built_in_transformer(layers=2))) == 2
    assert len(residual_blocks(residual())) == 2
    assert residual_blocks(mlp()) == [] and transformer_blocks(mlp()) == []


def test_a_keras_application_has_its_residual_blocks() -> None:
    blocks = residual_blocks(mobilenet())
    # MobileNetV2's 10 inverted residual blocks, each from its input to its sum: expand, depthwise, project.
    assert len(blocks) == 10 and all(len(block.nodes) == 9 for block in blocks)


def test_keras_hub_blocks_are_its_transformer_layers() -> None:
    keras.utils.set_random_seed(0)
    blocks = hub_blocks(hub_gpt2())
    assert [type(block).__name__ for block in blocks] == ["TransformerDecoder"] * 2


def test_a_model_without_blocks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigProblems, match=r"training\.remat: blocks: a mlp model has no blocks to recompute"):
        load_config(write_config(tmp_path / "c.yaml", model={"name": "mlp"}, training={"remat": "blocks"}))
    keras.utils.set_random_seed(0)
    with pytest.raises(ConfigError, match=r"training\.remat: blocks: .* has no blocks to recompute; use layers"):
        apply_remat(mlp(), Remat.BLOCKS, residual_blocks)


def test_the_key_takes_its_words_and_auto_is_none_without_a_budget(tmp_path: Path) -> None:
    for word in ("none", "activations", "blocks", "layers", "auto"):
        config = load_config(write_config(tmp_path / "c.yaml", model={"name": "transformer"}, training={"remat": word}))
        assert settle_remat(config.training.remat) is (Remat.NONE if word == "auto" else Remat(word))
    assert load_config(write_config(tmp_path / "d.yaml")).training.remat is Remat.NONE
    with pytest.raises(ConfigProblems, match=r"training\.remat: input should be"):
        load_config(write_config(tmp_path / "e.yaml", training={"remat": "full"}))


def test_an_activity_regularizer_is_refused() -> None:
    inputs = keras.Input((FEATURES,))
    outputs = keras.layers.Dense(CLASSES, activity_regularizer="l2", name="regularized")(inputs)
    with pytest.raises(ConfigError, match="cannot recompute regularized"):
        apply_remat(keras.Model(inputs, outputs), Remat.LAYERS, None)


def dropout_run(remat: str) -> dict[str, Any]:
    """An MLP with dropout on synthetic data: 4 updates of 2 sub-batches, 2 updates per compiled call (the replayed
    draws inside the compiled loop)."""
    return {
        "seed": 4,
        "data": {"name": "synthetic", "samples": 18, "shape": [6], "classes": 3, "validation_split": 0.1},
        "model": {"name": "mlp", "hidden": [8], "dropout": 0.5},
        "training": {"epochs": 1, "batch_size": 4, "subdivisions": 2, "updates_per_call": 2, "remat": remat},
        "optimizer": {"name": "sgd", "learning_rate": 0.5},
        "output": {"tensorboard": False},
    }


@pytest.mark.slow
def test_a_run_with_remat_trains_as_one_without(trained: Any) -> None:
    """The whole path: ``training.remat`` in a config reaches the run's model and step, which then trains the same
    weights, and the setup says what it recomputes."""
    from accumrun.training.console import describe_setup
    from accumrun.training.setup import build_training

    without, with_remat = trained("none", dropout_run("none")), trained("layers", dropout_run("layers"))
    assert with_remat.metrics[-1]["optimizer_steps"] == 4
    assert largest_difference(named_weights(with_remat.model), named_weights(without.model)) <= TOLERANCE
    lines = describe_setup(build_training(load_config(dropout_run("layers"))))
    assert "remat: layers: 2 layers with weights recomputed in the backward pass" in lines
