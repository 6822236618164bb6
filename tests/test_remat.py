"""``training.remat``: recomputing activations in the backward pass never changes a number.

One contract over the modes and the kinds of model: the weights after several SGD updates with remat equal those
without, with dropout on (each sample's masks are drawn again identically) and BatchNorm in every mode (its moving
statistics move once); the recomputation really happens; ``blocks`` finds each kind's blocks or is refused in one
line; ``auto`` without a memory budget is ``none``; and remat composes with mixed precision and with replicas.

The tolerance: a recomputed block runs the same operations on the same inputs, so its forward pass is the same
to the bit; its gradient comes from a second tape over it, whose sums may run in another order, which moves a
float32 gradient by a few units in the last place (2.2e-7 relative was measured over two Dense layers). Over
``UPDATES`` SGD updates of rate ``RATE`` on gradients below ``1`` in size here, each weight moves apart by at most
about ``UPDATES * RATE * 1 * 4 * 1.2e-7``, which with the propagation through later updates stays well below 1e-5,
the issue's bound.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun.config.loading import load_config
from accumrun.config.remat import settle_remat
from accumrun.core import recompute
from accumrun.core.batch_norm import BatchNormStatistics
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.core.seeds import LayerDraws
from accumrun.core.step import make_train_step
from accumrun.errors import ConfigError, ConfigProblems
from accumrun.kinds import BatchNormMode, Remat
from accumrun.models.blocks import hub_blocks, residual_blocks, transformer_blocks
from accumrun.models.remat import apply_remat
from accumrun.models.transformer import transformer
from tests.helpers import write_config

UPDATES, RATE, TOLERANCE = 3, 0.1, 1e-5
FEATURES, CLASSES, LENGTH, VOCABULARY = 6, 3, 10, 20
REPO = Path(__file__).resolve().parent.parent


def mlp() -> keras.Model:
    inputs = keras.Input((FEATURES,))
    x = keras.layers.Dense(16, activation="relu")(inputs)
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


def built_in_transformer() -> keras.Model:
    return transformer((LENGTH,), VOCABULARY, VOCABULARY, layers=2, heads=2, width=16, dropout=0.3, causal=True)


def hub_gpt2() -> keras.Model:
    """A tiny KerasHub GPT-2 backbone with a head of logits at every position, built as accumrun builds it."""
    from accumrun.models.hub import KerasHubConfig, keras_hub_model

    section = KerasHubConfig.model_validate(
        {"name": "keras_hub.models.GPT2Backbone", "num_layers": 2, "num_heads": 2, "hidden_dim": 16,
         "intermediate_dim": 32, "dropout": 0.3}
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


KINDS: dict[str, tuple[Callable[[], keras.Model], Callable[[keras.Model], list[Any]] | None, bool]] = {
    "mlp": (mlp, None, False),
    "residual": (residual, residual_blocks, False),
    "transformer": (built_in_transformer, transformer_blocks, True),
    "keras_hub": (hub_gpt2, hub_blocks, True),
}
"""Each kind of model: how it is made, how its blocks are found (None: it has none), whether it reads token ids."""


def batches(tokens: bool) -> list[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(1)
    if tokens:
        return [
            (tf.constant(rng.integers(1, VOCABULARY, (8, LENGTH)), tf.int32),
             tf.constant(rng.integers(1, VOCABULARY, (8, LENGTH)), tf.int32))
            for _ in range(UPDATES)
        ]  # fmt: skip
    return [
        (tf.constant(rng.normal(2.0, 1.5, (8, FEATURES)), tf.float32), tf.constant(rng.integers(CLASSES, size=8)))
        for _ in range(UPDATES)
    ]


def trained(kind: str, remat: Remat, batch_norm: BatchNormMode = BatchNormMode.PER_BATCH) -> list[np.ndarray]:
    """Every weight (moving statistics too) after ``UPDATES`` SGD updates in 3 sub-batches with per-sample draws."""
    make, find_blocks, tokens = KINDS[kind]
    keras.utils.set_random_seed(0)
    model = make()
    apply_remat(model, remat, find_blocks)
    optimizer = keras.optimizers.SGD(RATE)
    step = make_train_step(
        model,
        sparse_categorical_crossentropy,
        optimizer,
        3,
        batch_norm=BatchNormStatistics(model, batch_norm),
        draws=LayerDraws(model, optimizer.iterations),
    )
    for x, y in batches(tokens):
        step(x, y)
    return [np.array(w) for w in model.weights]


def largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


@pytest.fixture
def recomputations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a recomputed call runs while traced: once forward, once again in the backward pass."""
    runs: list[int] = []
    recompute_grad = tf.recompute_grad

    def counting(f: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            runs.append(1)
            return f(*args)

        return recompute_grad(counted)

    monkeypatch.setattr(recompute.tf, "recompute_grad", counting)
    return runs


@functools.cache
def trained_without(kind: str, batch_norm: BatchNormMode = BatchNormMode.PER_BATCH) -> list[np.ndarray]:
    """:func:`trained` without remat, once per module for the tests that compare with it (read only)."""
    return trained(kind, Remat.NONE, batch_norm)


slow = pytest.mark.slow
CASES = [
    ("residual", Remat.BLOCKS, BatchNormMode.PER_BATCH),
    *(
        pytest.param("residual", remat, mode, marks=slow)
        for remat, mode in [
            *((Remat.BLOCKS, mode) for mode in BatchNormMode if mode is not BatchNormMode.PER_BATCH),
            (Remat.LAYERS, BatchNormMode.SUB_BATCH),
        ]
    ),
    pytest.param("mlp", Remat.LAYERS, BatchNormMode.PER_BATCH, marks=slow),
    pytest.param("transformer", Remat.BLOCKS, BatchNormMode.PER_BATCH, marks=slow),
    pytest.param("transformer", Remat.ACTIVATIONS, BatchNormMode.PER_BATCH, marks=slow),
    pytest.param("keras_hub", Remat.BLOCKS, BatchNormMode.PER_BATCH, marks=slow),
]
"""Each mode on the kinds whose wrapping differs: ``blocks`` on each kind that has blocks, ``layers`` on an MLP and on
a recomputed BatchNorm layer (its call wrapped, in the sub-batch mode that runs it per sub-batch), Keras' own
``activations`` once; the residual blocks (a BatchNorm inside) in every BatchNorm mode, whose moving statistics must
move once however often their layer runs. A Keras application's residual blocks are these: MobileNetV2's are found
below (training it took 5 minutes here)."""


@pytest.mark.parametrize(("kind", "remat", "batch_norm"), [*CASES])
def test_remat_trains_the_same_weights(
    kind: str, remat: Remat, batch_norm: BatchNormMode, recomputations: list[int]
) -> None:
    without = trained_without(kind, batch_norm)
    recomputations.clear()
    assert largest_difference(trained(kind, remat, batch_norm), without) <= TOLERANCE
    if remat is not Remat.ACTIVATIONS:  # Keras' mode recomputes through Keras' own tf.recompute_grad
        assert recomputations and len(recomputations) % 2 == 0  # each call ran again in the backward pass


@slow
def test_the_draws_are_replayed_not_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a recomputation that draws its dropout masks anew trains other weights."""
    without = trained_without("transformer")
    monkeypatch.setattr(LayerDraws, "_replay_point", lambda self: contextlib.nullcontext)
    assert largest_difference(trained("transformer", Remat.BLOCKS), without) > 1e-3


def test_blocks_are_found_per_kind() -> None:
    keras.utils.set_random_seed(0)
    assert len(transformer_blocks(built_in_transformer())) == 2
    assert len(residual_blocks(residual())) == 2
    assert residual_blocks(mlp()) == [] and transformer_blocks(mlp()) == []


@slow
def test_a_keras_application_has_its_residual_blocks() -> None:
    blocks = residual_blocks(mobilenet())
    # MobileNetV2's 10 inverted residual blocks, each from its input to its sum: expand, depthwise, project.
    assert len(blocks) == 10 and all(len(block.nodes) == 9 for block in blocks)


@pytest.mark.slow
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


@slow
def test_remat_composes_with_mixed_precision() -> None:
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        without = trained("residual", Remat.NONE)
        with_remat = trained("residual", Remat.BLOCKS)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    # The same bound: the variables are float32, and the recomputed bfloat16 forward pass is the same to the bit.
    assert largest_difference(with_remat, without) <= TOLERANCE


_REPLICAS_CHILD = """
import json, sys
from accumrun.training.distribute import create_strategy
from accumrun.config.schema import DistributeConfig
strategy = create_strategy(DistributeConfig(strategy="mirrored", logical_cpus=2))
from tests import test_remat as t
results = {}
for remat in (t.Remat.NONE, t.Remat.BLOCKS):
    with strategy.scope():
        results[str(remat)] = [w.tolist() for w in t.trained_on_replicas(strategy, remat)]
json.dump(results, open(sys.argv[1], "w"))
"""


def trained_on_replicas(strategy: tf.distribute.Strategy, remat: Remat) -> list[np.ndarray]:
    """:func:`trained` on the built-in transformer, its batches dealt out to the replicas of ``strategy``."""
    keras.utils.set_random_seed(0)
    model = built_in_transformer()
    apply_remat(model, remat, transformer_blocks)
    optimizer = keras.optimizers.SGD(RATE)
    optimizer.build(model.trainable_variables)
    step = make_train_step(
        model,
        sparse_categorical_crossentropy,
        optimizer,
        2,
        strategy=strategy,
        draws=LayerDraws(model, optimizer.iterations),
    )
    for x, y in batches(tokens=True):
        step(x, y)
    return [np.array(w) for w in model.weights]


@pytest.mark.slow
@pytest.mark.subprocess
def test_remat_composes_with_replicas(tmp_path: Path) -> None:
    out = tmp_path / "weights.json"
    child = subprocess.run(
        [sys.executable, "-c", _REPLICAS_CHILD, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert child.returncode == 0, child.stderr[-4000:]
    results = {key: [np.array(w) for w in weights] for key, weights in json.loads(out.read_text()).items()}
    assert largest_difference(results["blocks"], results["none"]) <= TOLERANCE


def dropout_run(remat: str) -> dict[str, Any]:
    """An MLP with dropout on synthetic data, 2 epochs of 3 updates, several updates per compiled call."""
    return {
        "seed": 4,
        "data": {"name": "synthetic", "samples": 33, "shape": [6], "classes": 3, "validation_split": 0.1},
        "model": {"name": "mlp", "hidden": [32, 32], "dropout": 0.5},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": 2, "updates_per_call": 3, "remat": remat},
        "optimizer": {"name": "sgd", "learning_rate": 0.5},
        "output": {"tensorboard": False},
    }


@slow
def test_a_run_with_remat_trains_as_one_without(trained: Any) -> None:
    from accumrun.training.console import describe_setup
    from accumrun.training.setup import build_training

    without, with_remat = trained("none", dropout_run("none")), trained("layers", dropout_run("layers"))
    assert with_remat.metrics[-1]["optimizer_steps"] == 6
    assert largest_difference(with_remat.model.get_weights(), without.model.get_weights()) <= TOLERANCE
    lines = describe_setup(build_training(load_config(dropout_run("layers"))))
    assert "remat: layers: 3 layers with weights recomputed in the backward pass" in lines
