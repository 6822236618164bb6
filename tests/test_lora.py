"""LoRA (``model.lora``) and its int8 base (``model.quantize``) on every kind of model: only the adapters train,
accumulation stays exact (with remat too), a run stopped hard resumes exactly, and a LoRA run's files serve every
command.

Tolerance of subdivided against plain training (2e-5): both runs take the same SGD steps (learning rate 0.5, at most
2 updates) from the same weights with the same per-sample dropout masks; they differ only in the order of float32
sums. A gradient entry here sums at most n = 71 * 16 products (fewer at the tiny sizes below) of magnitude at most
~1 (Higham's bound for a sum of n terms is n * 2^-24 relative to the sum of magnitudes, 7e-5 worst case, but
rounding errors add as a random walk: sqrt(n) * 2^-24 = 2e-6), and two updates at a learning rate of 0.5 carry 2 *
0.5 * 2e-6 = 2e-6 into a weight, ten times under the 2e-5 that the issue asks for.
"""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import warnings
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from accumrun import train
from accumrun.config.loading import load_config, load_resume_config
from accumrun.data.examples import write_corpus
from accumrun.errors import ConfigError
from accumrun.kinds import ModelFile
from accumrun.models.lora import adapt, weight_counts, wrap_int8_calls
from accumrun.models.transformer import transformer
from accumrun.models.transformer_kind import TransformerConfig
from accumrun.reports.finished import FinishedRun
from accumrun.training.setup import build_training
from tests.helpers import invoke, signal_after_batch, write_config
from tests.lora_models import LORA, dense_norm
from tests.test_compare import variants_in_this_process

GPT2 = {"num_layers": 1, "num_heads": 2, "hidden_dim": 16, "intermediate_dim": 32, "dropout": 0.1}


def vectors(model: dict[str, Any], **training: Any) -> dict[str, Any]:
    """16 synthetic samples of 8 features, 2 batches of 8, SGD."""
    return {
        "seed": 3,
        "data": {"name": "synthetic", "samples": 16, "shape": [8], "classes": 3, "validation_split": 0.0},
        "model": model,
        "training": {"epochs": 1, "batch_size": 8, "subdivisions": 1, **training},
        "optimizer": {"name": "sgd", "learning_rate": 0.5},
        "output": {"tensorboard": False},
    }


def text(folder: Path, model: dict[str, Any], **training: Any) -> dict[str, Any]:
    """A language model on windows of 8 characters, 2 full-batch updates, SGD."""
    corpus = folder / "corpus"
    if not corpus.exists():
        write_corpus(corpus, 2, seed=4)
    sections = vectors(model, **{"epochs": 2, "batch_size": "full", **training})
    sections["data"] = {"name": "text_corpus", "path": str(corpus), "sequence_length": 8, "validation_split": 0.0}
    return sections


def saved_model(folder: Path) -> str:
    path = folder / "base.keras"
    keras.utils.set_random_seed(5)
    dense_norm((8,), 3).save(path)
    return str(path)


# Each kind, with what LoRA adapts by default: the attention's query and value where the model has attention, else
# every Dense. The builtin mlp (unnamed Dense layers, dropout) takes the same every-Dense path as "saved" and
# "custom", so it is not run again; "custom" runs on its int8 base, which covers the plain custom path too.
KINDS: dict[str, Any] = {
    "transformer": (
        lambda folder: text(folder, {"name": "transformer", "layers": 1, "heads": 2, "width": 16, "dropout": 0.2}),
        ["attention_0/query", "attention_0/value"],
    ),
    "keras_hub": (
        lambda folder: text(folder, {"name": "keras_hub.models.GPT2Backbone", **GPT2}),
        ["transformer_layer_0/self_attention/query", "transformer_layer_0/self_attention/value"],
    ),
    "saved": (lambda folder: vectors({"name": "saved", "path": saved_model(folder)}), ["hidden", "head"]),
    "custom": (lambda folder: vectors({"name": "tests.lora_models:dense_norm"}), ["hidden", "head"]),
}


def adapter_values(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(variable.numpy()) for variable in model.trainable_variables]


def frozen_values(model: keras.Model) -> list[np.ndarray]:
    trainable = {id(variable) for variable in model.trainable_variables}
    return [np.asarray(v.numpy()) for v in model.weights if id(v) not in trainable]


def stepped(
    path: Path, subdivisions: int, *overrides: str
) -> tuple[tuple[list[np.ndarray], list[np.ndarray]], keras.Model]:
    """The config's model as built (its frozen values and its adapters) and after its epochs of batches through the
    run's train step for ``subdivisions`` (and any ``--set`` overrides), in the run's order: what a run trains,
    without the files a run writes (the test of a run's files below runs one whole)."""
    setup = build_training(load_config(path, [f"training.subdivisions={subdivisions}", *overrides]))
    start = frozen_values(setup.trained.model), adapter_values(setup.trained.model)
    step = setup.make_step(subdivisions)
    batches = setup.fed.chunk_sizes(subdivisions)
    feeder = setup.fed.train_feeder([size for sizes in batches for size in sizes])
    for epoch in range(setup.config.training.epochs):
        chunks = iter(feeder.epoch(epoch))
        for sizes in batches:
            step.train_batch([next(chunks) for _ in sizes], sum(sizes))
    return start, setup.trained.model


# How each kind's subdivided run varies beyond LoRA (quantize, training.remat): KerasHub's blocks recomputed, and the
# custom model on its int8 base, each int8 layer recomputed with its deferred backward pass inside.
VARIED: dict[str, tuple[str | None, str]] = {"keras_hub": (None, "blocks"), "custom": ("int8", "layers")}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_only_the_adapters_train_and_subdivided_equals_plain(
    tmp_path: Path, kind: str, recomputations: list[int]
) -> None:
    """Subdivided against plain; on two kinds (``VARIED``) the subdivided run also recomputes: remat composes with
    LoRA, and with the int8 base. A recomputation adds a few units in the last place (tests/test_remat.py), inside
    the bound above."""
    quantize, remat = VARIED.get(kind, (None, "none"))
    sections, adapted = KINDS[kind]
    config = sections(tmp_path)
    config["model"] = {**config["model"], "lora": LORA, "quantize": quantize}
    path = write_config(tmp_path / "lora.yaml", **config)
    (frozen, adapters), plain = stepped(path, 1)
    recomputations.clear()
    runs = [plain, stepped(path, 4, f"training.remat={remat}")[1]]
    assert set(recomputations) == ({2} if remat != "none" else set())  # each call ran again in the backward pass
    # Only the adapters train: two matrices per adapted layer, each moved, the rest exactly where it started.
    for model in runs:
        paths = [variable.path for variable in model.trainable_variables]
        expected = [f"{layer}/lora_kernel_{ab}" for layer in adapted for ab in "ab"]
        assert len(paths) == len(expected) and all(map(fnmatchcase, paths, expected)), paths
        for before, after in zip(frozen, frozen_values(model), strict=True):
            np.testing.assert_array_equal(before, after)
        assert all(not np.array_equal(a, b) for a, b in zip(adapters, adapter_values(model), strict=True))
    # Exact accumulation, with dropout on (and, for the custom and saved models, BatchNorm frozen): see the top.
    for plain, subdivided in zip(adapter_values(runs[0]), adapter_values(runs[1]), strict=True):
        np.testing.assert_allclose(subdivided, plain, rtol=0, atol=2e-5)
    counts = weight_counts(runs[0])
    assert counts.trainable == sum(a.size for a in adapter_values(runs[0]))
    assert (counts.bytes < counts.unquantized_bytes) == (quantize is not None)


def test_only_the_int8_dense_layers_wait_for_their_gradient() -> None:
    """The deferral on the layers whose backward pass dequantizes their kernel, not on the int8 embeddings."""
    model = transformer((4,), 8, 8, layers=1, heads=2, width=8, dropout=0.0, causal=True)
    section = TransformerConfig.model_validate({"name": "transformer", "lora": LORA, "quantize": "int8"})
    adapt(model, section, attention=True)
    quantized = [layer for layer in model._flatten_layers(include_self=False) if layer.quantization_mode is not None]
    waiting = {type(layer).__name__ for layer in quantized if "quantized_call" in vars(layer)}
    assert waiting == {"Dense", "EinsumDense"}
    assert {type(layer).__name__ for layer in quantized} - waiting == {"Embedding"}


def test_a_base_that_is_int8_already_is_wrapped_once() -> None:
    """A base that comes int8 (a saved int8 model) gets the float32 products and the deferral without ``quantize``;
    wrapping again leaves each layer's call as it is."""
    model = transformer((4,), 8, 8, layers=1, heads=2, width=8, dropout=0.0, causal=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras names every layer that has no int8 form
        model.quantize("int8")
    adapt(model, TransformerConfig.model_validate({"name": "transformer", "lora": LORA}), attention=True)
    products = [layer for layer in model._flatten_layers(include_self=False) if layer.quantization_mode is not None]
    products = [layer for layer in products if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))]
    calls = [vars(layer).get("quantized_call") for layer in products]
    assert products and all(calls)
    wrap_int8_calls(model)
    assert [vars(layer)["quantized_call"] for layer in products] == calls


@pytest.mark.parametrize("frozen_before", [False, True])
def test_quantizing_leaves_the_garbage_collector_as_it_found_it(frozen_before: bool) -> None:
    """Quantizing freezes the objects made before it (Keras collects once per layer it quantizes) and unfreezes them
    after; objects that the process froze itself stay frozen."""
    model = transformer((4,), 8, 8, layers=1, heads=2, width=8, dropout=0.0, causal=True)
    section = TransformerConfig.model_validate({"name": "transformer", "lora": LORA, "quantize": "int8"})
    if frozen_before:
        gc.freeze()
    try:
        adapt(model, section, attention=True)
        assert (gc.get_freeze_count() > 0) == frozen_before
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("layer", ["dense", "einsum_dense"])
def test_an_int8_layers_backward_waits_for_its_gradient_and_gives_the_same_numbers(layer: str) -> None:
    import tensorflow as tf

    from accumrun.core.deferred import deferred_backward

    keras.utils.set_random_seed(0)
    base = keras.layers.Dense(8) if layer == "dense" else keras.layers.EinsumDense("ab,bc->ac", output_shape=8)
    base.build((None, 6))
    base.quantize("int8")
    base.enable_lora(2)
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 6)), tf.float32)

    def gradients(deferred: bool) -> tuple[list[tf.Tensor], list[tf.Operation]]:
        def call(inputs: tf.Tensor) -> tf.Tensor:
            # By keyword, as a model may pass it: its gradient must flow all the same.
            return deferred_backward(base.quantized_call, [], {"inputs": inputs}) if deferred else base(inputs)

        @tf.function
        def step(inputs: tf.Tensor) -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                loss = tf.reduce_sum(tf.sin(call(inputs)))
            return tape.gradient(loss, [inputs, *base.trainable_variables])

        graph = step.get_concrete_function(x).graph
        # Keras' int8 gradient dequantizes the kernel (a cast from int8) from the kernel alone.
        dequantized = [op for op in graph.get_operations() if op.type == "Cast" and op.inputs[0].dtype == tf.int8]
        return step(x), dequantized

    plain, plain_casts = gradients(deferred=False)
    deferred, deferred_casts = gradients(deferred=True)
    for a, b in zip(plain, deferred, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # Without the wait the dequantization may start before the forward pass ends; with it, only after its gradient.
    assert len(plain_casts) == len(deferred_casts) == 1
    assert not plain_casts[0].control_inputs and deferred_casts[0].control_inputs


@pytest.mark.parametrize("layer", ["dense", "einsum_dense"])
def test_an_int8_product_in_float32_gives_keras_numbers_to_the_bit(layer: str) -> None:
    """Inside ``int8_products_in_float32`` an int8 layer multiplies in float32 (no integer product in its graph), each
    operand cast only once both exist; over an inner dimension below 1,041 its outputs and gradients are those of
    Keras' int32 product to the bit. Outside, the product is Keras' own again."""
    import tensorflow as tf

    from accumrun.models.int8_matmul import int8_products_in_float32

    keras.utils.set_random_seed(0)
    base = keras.layers.Dense(8) if layer == "dense" else keras.layers.EinsumDense("ab,bc->ac", output_shape=8)
    base.build((None, 48))
    base.quantize("int8")
    base.enable_lora(2)
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 48)) * 10, tf.float32)

    def run(in_float32: bool) -> tuple[list[np.ndarray], list[tf.Operation], list[tf.Operation]]:
        @tf.function
        def step(inputs: tf.Tensor) -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                with int8_products_in_float32() if in_float32 else contextlib.nullcontext():
                    outputs = base(inputs)
                loss = tf.reduce_sum(tf.sin(outputs))
            return [outputs, *tape.gradient(loss, [inputs, *base.trainable_variables])]

        products = [op for op in step.get_concrete_function(x).graph.get_operations() if "MatMul" in op.type]
        integer = [op for op in products if op.inputs[0].dtype == tf.int8]
        casts = [t.op for op in products for t in op.inputs if t.op.type == "Cast" and t.op.inputs[0].dtype == tf.int8]
        return [t.numpy() for t in step(x)], integer, casts

    keras_numbers, keras_products, _ = run(in_float32=False)
    float_numbers, float_products, casts = run(in_float32=True)
    for a, b in zip(keras_numbers, float_numbers, strict=True):
        np.testing.assert_array_equal(a, b)
    assert keras_products and not float_products
    # The kernel's cast waits for the quantized inputs, so no layer's float32 kernel is made ahead of its turn.
    assert len(casts) == 2 and all(cast.control_inputs for cast in casts)
    assert run(in_float32=False)[1]


@pytest.mark.parametrize(
    ("lora", "quantize", "expected"),
    [
        ({"rank": 0}, None, "model.lora.rank: input should be greater than or equal to 1"),
        (None, "int8", "model.quantize: an int8 layer does not train itself: set model.lora to train adapters"),
        (
            {"rank": 2, "targets": ["hidden", "output*"]},
            None,
            "model.lora.targets: 'output*' matches no layer; the Dense and EinsumDense layers are hidden, head",
        ),
        ({"rank": 4}, None, "model.lora.rank: is above the dimensions of head (kernel 16x3: a rank of at most 3)"),
    ],
)
def test_bad_lora_settings_are_refused_in_one_line(
    tmp_path: Path, lora: dict[str, Any] | None, quantize: str | None, expected: str
) -> None:
    model = {"name": "tests.lora_models:dense_norm", "lora": lora, "quantize": quantize}
    result = invoke("train", str(write_config(tmp_path / "bad.yaml", **vectors(model))))
    assert result.returncode == 1
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_int8_base_under_mixed_float16_is_refused_in_one_line(tmp_path: Path) -> None:
    model = {"name": "tests.lora_models:dense_norm", "lora": {"rank": 2}, "quantize": "int8"}
    result = invoke("train", str(write_config(tmp_path / "bad.yaml", **vectors(model, precision="mixed_float16"))))
    assert result.returncode == 1
    expected = "training.precision: Keras' int8 layers do not compute in float16; use mixed_bfloat16 with"
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_a_lora_runs_files_serve_keras_and_every_command_and_its_adapters_start_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hidden layer alone adapted (its kernel of 16x32 takes a rank up to 16); the head stays frozen.
    lora = {**LORA, "targets": ["hidden"]}
    config = vectors({"name": "tests.lora_models:dense_norm", "hidden": 32, "lora": lora}, epochs=2, subdivisions=2)
    config["data"].update(shape=[16], validation_split=0.2)
    path = write_config(tmp_path / "lora.yaml", **config)
    result = train(load_config(path), tmp_path / "run", quiet=True)
    run = result.run_dir

    # model.keras is plain Keras with the adapters merged: it computes what the trained model computes (float32
    # rounding of x @ (W + s A B) against x @ W + s (x @ A) @ B, relative 1e-6 at these sizes).
    x = np.random.default_rng(0).normal(size=(6, 16)).astype("float32")
    merged = keras.models.load_model(run / "model.keras", compile=False)
    np.testing.assert_allclose(merged(x), result.model(x), rtol=1e-5, atol=1e-5)
    # Keras rebuilds the layers with adapters, at zero: the kernels hold them.
    assert not any(np.any(variable.numpy()) for variable in merged.weights if "lora" in variable.path)

    np.savez(tmp_path / "x.npz", x=x)
    for command in (["evaluate", str(run)], ["predict", str(run), str(tmp_path / "x.npz")], ["export", str(run)]):
        done = invoke(*command)
        assert done.returncode == 0, done.stderr

    # The adapters alone start a run on the same base; on another base (another seed draws other weights), they are
    # refused.
    started = dict(config["model"], adapters=str(run / "adapters.weights.h5"))
    again = write_config(tmp_path / "again.yaml", **{**config, "model": started})
    model = build_training(load_config(again)).trained.model
    for mine, theirs in zip(adapter_values(model), adapter_values(result.model), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    with pytest.raises(ConfigError, match="model.adapters: was saved from another base"):
        build_training(load_config(again, ["seed=4"]))

    # compare --vary of the rank: each variant's train command runs in this process (tests/test_compare.py covers
    # the variants as processes), one update each.
    commands = variants_in_this_process(monkeypatch)
    varied = invoke(
        "compare", str(path), "--vary", "model.lora.rank=4,16", "--epochs", "1", "--run-dir", str(tmp_path / "compare")
    )
    assert varied.returncode == 0, varied.stderr
    assert [command[-3] for command in commands] == ["model.lora.rank=4", "model.lora.rank=16"]
    assert "model.lora.rank=16" in varied.stdout

    # A language model with LoRA on an int8 base generates.
    lm = write_config(
        tmp_path / "lm.yaml",
        **text(
            tmp_path, {"name": "transformer", "layers": 1, "heads": 2, "width": 16, "lora": LORA, "quantize": "int8"}
        ),
    )
    trained = invoke("train", str(lm), "--run-dir", str(tmp_path / "lm"))
    assert trained.returncode == 0, trained.stderr
    assert "lora rank 2, alpha 4 on 2 layers (attention_0/value, attention_0/query): 160 trainable parameters" in (
        trained.stdout
    )
    assert "quantize int8: weights " in trained.stdout
    generated = invoke("generate", str(tmp_path / "lm"), "--prompt", "The ", "--max-tokens", "5")
    assert generated.returncode == 0 and generated.stdout.startswith("The "), generated.stderr
    # Served, its int8 layers multiply in float32 as in training.
    served = FinishedRun(tmp_path / "lm").load_model(ModelFile.FINAL)
    quantized = [layer for layer in served._flatten_layers(include_self=False) if layer.quantization_mode is not None]
    products = [layer for layer in quantized if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))]
    assert products and all("quantized_call" in vars(layer) for layer in products)


@pytest.mark.slow
def test_a_lora_run_stopped_hard_mid_run_resumes_to_the_uninterrupted_adapters_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Full batch in 2 sub-batches, a checkpoint every 5 updates; the checkpoints hold the adapters and their
    # optimizer state alone, and the base is rebuilt from the config. A second Ctrl-C after update 8 ends the run
    # with no checkpoint of its own, as a SIGKILL would (tests/test_resume.py kills a process anywhere): it resumes
    # from update 5's, in this process.
    path = write_config(
        tmp_path / "kill.yaml",
        seed=4,
        data={"name": "synthetic", "samples": 30, "shape": [4], "classes": 3, "validation_split": 0.0},
        model={"name": "tests.hook_models:mlp", "hidden": [8], "lora": {"rank": 2}, "quantize": "int8"},
        training={"epochs": 9, "batch_size": "full", "subdivisions": 2},
        optimizer={"name": "adam", "learning_rate": 0.01},
        output={"tensorboard": False, "checkpoint_every_updates": 5},
    )
    reference = train(load_config(path), tmp_path / "reference", quiet=True)
    run_dir = tmp_path / "run"
    signal_after_batch(monkeypatch, 8, [signal.SIGINT, signal.SIGINT])
    with pytest.raises(KeyboardInterrupt):
        train(load_config(path), run_dir, quiet=True)
    monkeypatch.undo()
    assert "second Ctrl-C" in json.loads((run_dir / "run.json").read_text())["reason"]
    resumed = train(load_resume_config(run_dir, None), run_dir, quiet=True, resume=True)
    for mine, theirs in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
