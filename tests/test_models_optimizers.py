"""build_model and build_optimizer: the registry of models, Keras optimizers and schedules by name."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

from accumrun.config.schema import OptimizerConfig
from accumrun.errors import ConfigError, DataError
from accumrun.models.builders import build_model
from accumrun.models.darknet_cnn import DarknetCnnConfig
from accumrun.models.factory import CustomModelConfig
from accumrun.models.mlp import MlpConfig
from accumrun.optim import build_optimizer, build_schedule
from accumrun.optim.schedules import ScheduleConfig

# --- models ---------------------------------------------------------------------------------------------------


def test_darknet_cnn_maps_images_to_one_logit_per_class() -> None:
    model = build_model(DarknetCnnConfig(), (8, 8, 1), 10)
    assert model.name == "darknet_cnn"
    assert model.input_shape == (None, 8, 8, 1)
    assert model.output_shape == (None, 10)


def test_darknet_cnn_blocks_follow_the_config() -> None:
    config = DarknetCnnConfig.model_validate({"filters": [4, 6], "strides": [2, 1], "leaky_alpha": 0.2})
    model = build_model(config, (8, 8, 3), 5)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [conv.filters for conv in convs] == [4, 6]
    assert [conv.strides for conv in convs] == [(2, 2), (1, 1)]
    assert all(conv.use_bias is False and conv.bias is None for conv in convs)
    assert [len(conv.weights) for conv in convs] == [1, 1]
    assert sum(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers) == 2
    relus = [layer for layer in model.layers if isinstance(layer, keras.layers.LeakyReLU)]
    assert [relu.negative_slope for relu in relus] == pytest.approx([0.2, 0.2])
    # 3x3x3x4 + 3x3x4x6 kernels, 4 BatchNorm vectors of 4 and 6, Dense 6x5 + 5.
    assert model.count_params() == 108 + 216 + 4 * 4 + 4 * 6 + 30 + 5
    assert model(np.zeros((2, 8, 8, 3), np.float32)).shape == (2, 5)


@pytest.mark.parametrize("shape", [(64,), (8, 8)])
def test_darknet_cnn_refuses_samples_that_are_not_images(shape: tuple[int, ...]) -> None:
    with pytest.raises(DataError) as info:
        build_model(DarknetCnnConfig(), shape, 10)
    assert str(info.value) == f"data: darknet_cnn needs image samples of shape (height, width, channels) (got {shape})"
    assert "darknet_cnn needs image samples" in str(info.value)


def test_mlp_with_dropout() -> None:
    config = MlpConfig.model_validate({"name": "mlp", "hidden": [8, 4], "activation": "tanh", "dropout": 0.25})
    model = build_model(config, (2, 3), 3)
    assert model.name == "mlp"
    assert model.output_shape == (None, 3)
    assert [type(layer).__name__ for layer in model.layers] == [
        "InputLayer",
        "Flatten",
        "Dense",
        "Dropout",
        "Dense",
        "Dropout",
        "Dense",
    ]
    assert [layer.rate for layer in model.layers if isinstance(layer, keras.layers.Dropout)] == [0.25, 0.25]
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert [layer.units for layer in dense] == [8, 4, 3]
    assert [layer.activation.__name__ for layer in dense] == ["tanh", "tanh", "linear"]
    assert model.count_params() == (6 * 8 + 8) + (8 * 4 + 4) + (4 * 3 + 3)


def test_mlp_without_dropout_has_no_dropout_layer() -> None:
    model = build_model(MlpConfig.model_validate({"name": "mlp", "hidden": [8]}), (4,), 3)
    assert [type(layer).__name__ for layer in model.layers] == ["InputLayer", "Flatten", "Dense", "Dense"]


def test_mlp_unknown_activation() -> None:
    with pytest.raises(ConfigError) as info:
        build_model(MlpConfig.model_validate({"name": "mlp", "hidden": [8], "activation": "relux"}), (4,), 3)
    assert str(info.value).startswith("model.activation: unknown activation: ")
    assert str(info.value).endswith("(got 'relux')")


def test_unknown_model_config() -> None:
    with pytest.raises(ConfigError) as info:
        build_model(object(), (4,), 3)
    assert str(info.value).startswith("model.name: unknown model (got <object object at ")


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the working directory and on sys.path, as a user's project with its own model file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def write_module(path: Path, source: str, monkeypatch: pytest.MonkeyPatch, *module_names: str) -> None:
    """Write a user's model file; the named modules are absent from sys.modules now and after the test."""
    path.write_text(textwrap.dedent(source))
    for name in module_names:
        # setitem records "absent" (or the old module) for undo; delitem then removes the placeholder.
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)


CUSTOM_MODEL = """
    import keras

    received = {}

    def tiny(input_shape, classes, width=2, activation="relu", bias=True):
        received.update(input_shape=input_shape, classes=classes, width=width, activation=activation, bias=bias)
        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Flatten()(inputs)
        x = keras.layers.Dense(width, activation=activation)(x)
        return keras.Model(inputs, keras.layers.Dense(classes)(x), name="tiny")

    def not_a_model(input_shape, classes):
        return 42
"""


def test_custom_model_gets_input_shape_classes_and_extra_keywords(
    user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_module(user_dir / "accumrun_test_user_models.py", CUSTOM_MODEL, monkeypatch, "accumrun_test_user_models")
    config = CustomModelConfig.model_validate(
        # `no` is text in the config (YAML 1.2); a keyword whose default is a boolean reads it as false.
        {"name": "accumrun_test_user_models:tiny", "width": 7, "activation": "tanh", "bias": "no"}
    )
    model = build_model(config, (3, 2), 4)
    assert model.name == "tiny"
    assert model.output_shape == (None, 4)
    assert model.count_params() == (6 * 7 + 7) + (7 * 4 + 4)
    received = sys.modules["accumrun_test_user_models"].received
    assert received == {"input_shape": (3, 2), "classes": 4, "width": 7, "activation": "tanh", "bias": False}


def test_custom_model_in_a_package(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = user_dir / "accumrun_test_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_module(package / "nets.py", CUSTOM_MODEL, monkeypatch, "accumrun_test_pkg", "accumrun_test_pkg.nets")
    model = build_model(CustomModelConfig.model_validate({"name": "accumrun_test_pkg.nets:tiny"}), (5,), 2)
    assert model.output_shape == (None, 2)
    assert model.count_params() == (5 * 2 + 2) + (2 * 2 + 2)


def test_custom_model_module_missing(user_dir: Path) -> None:
    config = CustomModelConfig.model_validate({"name": "accumrun_no_such_module:build"})
    with pytest.raises(ConfigError) as info:
        build_model(config, (4,), 3)
    assert str(info.value) == (
        "model.name: cannot import module 'accumrun_no_such_module': "
        "ModuleNotFoundError: No module named 'accumrun_no_such_module' "
        "(got 'accumrun_no_such_module:build')"
    )
    assert "cannot import module" in str(info.value)


def test_custom_model_function_missing(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_module(user_dir / "accumrun_test_nofn.py", CUSTOM_MODEL, monkeypatch, "accumrun_test_nofn")
    with pytest.raises(ConfigError) as info:
        build_model(CustomModelConfig.model_validate({"name": "accumrun_test_nofn:build"}), (4,), 3)
    assert str(info.value) == (
        "model.name: module 'accumrun_test_nofn' has no function 'build' (got 'accumrun_test_nofn:build')"
    )


def test_custom_model_returning_a_non_model(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_module(user_dir / "accumrun_test_nonmodel.py", CUSTOM_MODEL, monkeypatch, "accumrun_test_nonmodel")
    with pytest.raises(ConfigError) as info:
        build_model(CustomModelConfig.model_validate({"name": "accumrun_test_nonmodel:not_a_model"}), (4,), 3)
    assert str(info.value) == "model.name: the function must return a keras.Model (got 'int')"


def test_custom_model_rejecting_an_extra_keyword(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_module(user_dir / "accumrun_test_kwargs.py", CUSTOM_MODEL, monkeypatch, "accumrun_test_kwargs")
    config = CustomModelConfig.model_validate({"name": "accumrun_test_kwargs:tiny", "depth": 3})
    with pytest.raises(ConfigError) as info:
        build_model(config, (4,), 3)
    assert str(info.value) == (
        "model: accumrun_test_kwargs:tiny rejected its arguments: tiny() got an unexpected keyword argument 'depth'"
    )


# --- optimizers -----------------------------------------------------------------------------------------------


def optimizer(**settings: object) -> keras.optimizers.Optimizer:
    return build_optimizer(OptimizerConfig.model_validate(settings))


def message(**settings: object) -> str:
    with pytest.raises(ConfigError) as info:
        optimizer(**settings)
    return str(info.value)


def test_default_optimizer_is_adam() -> None:
    built = build_optimizer(OptimizerConfig())
    assert type(built) is keras.optimizers.Adam
    assert float(built.learning_rate) == pytest.approx(0.001)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("adam", keras.optimizers.Adam),
        ("Adam", keras.optimizers.Adam),
        ("AdamW", keras.optimizers.AdamW),
        ("adam_w", keras.optimizers.AdamW),
        ("adamw", keras.optimizers.AdamW),
        ("rms_prop", keras.optimizers.RMSprop),
        ("sgd", keras.optimizers.SGD),
    ],
)
def test_optimizers_by_name(name: str, cls: type) -> None:
    built = optimizer(name=name, learning_rate=0.5)
    assert type(built) is cls
    assert float(built.learning_rate) == 0.5


def test_sgd_takes_its_momentum_keyword() -> None:
    built = optimizer(name="sgd", learning_rate=0.1, momentum=0.9, nesterov=True)
    assert type(built) is keras.optimizers.SGD
    assert built.momentum == 0.9
    assert built.nesterov is True
    assert float(built.learning_rate) == pytest.approx(0.1)


@pytest.mark.parametrize(("word", "expected"), [("no", False), ("off", False), ("yes", True), ("On", True)])
def test_a_keras_keyword_whose_default_is_a_boolean_reads_yes_no_on_off(word: str, expected: bool) -> None:
    # The config is YAML 1.2, so `nesterov: no` arrives as text, which Keras would keep as a true value.
    assert optimizer(name="sgd", momentum=0.9, nesterov=word).nesterov is expected
    assert optimizer(name="adam", amsgrad=word).amsgrad is expected


@pytest.mark.parametrize("word", ["maybe", "false", 1])
def test_a_keras_keyword_whose_default_is_a_boolean_refuses_anything_else(word: object) -> None:
    # Keras keeps any value as given, and the text "false" is true.
    with pytest.raises(ConfigError, match=r"^optimizer\.nesterov: must be true or false \(or yes/no, on/off\)"):
        optimizer(name="sgd", momentum=0.9, nesterov=word)


def test_adamw_takes_weight_decay() -> None:
    assert optimizer(name="adam_w", weight_decay=0.01).weight_decay == 0.01


def test_unknown_optimizer_transposition_suggests_adam() -> None:
    assert message(name="adma") == "optimizer.name: unknown optimizer; did you mean 'Adam'? (got 'adma')"


@pytest.mark.parametrize(("typo", "suggestion"), [("adamm", "Adam"), ("sgdd", "SGD"), ("rmsprp", "RMSprop")])
def test_unknown_optimizer_suggests_a_close_name(typo: str, suggestion: str) -> None:
    assert message(name=typo) == f"optimizer.name: unknown optimizer; did you mean '{suggestion}'? (got '{typo}')"


def test_unknown_optimizer_without_a_close_name_lists_them() -> None:
    text = message(name="zzzzqq")
    assert text.startswith("optimizer.name: unknown optimizer; known: ")
    assert text.endswith(" (got 'zzzzqq')")
    known = text.removeprefix("optimizer.name: unknown optimizer; known: ").removesuffix(" (got 'zzzzqq')")
    names = known.split(", ")
    assert names == sorted(names)
    assert {"Adam", "AdamW", "SGD", "RMSprop"} <= set(names)
    assert "LossScaleOptimizer" not in names
    assert "Optimizer" not in names


def test_wrapper_optimizers_cannot_be_built_by_name() -> None:
    assert message(name="loss_scale_optimizer").startswith("optimizer.name: unknown optimizer; known: ")


def test_keyword_typo_names_its_key_and_suggests_the_right_one() -> None:
    text = message(name="adam", betta_1=0.8)
    assert "optimizer.betta_1" in text
    assert "did you mean 'beta_1'?" in text
    assert text == "optimizer.betta_1: Adam has no such argument; did you mean 'beta_1'? (got 0.8)"


def test_gradient_accumulation_steps_is_refused() -> None:
    text = message(name="adam", gradient_accumulation_steps=4)
    assert "training.subdivisions" in text
    assert (
        text == "optimizer.gradient_accumulation_steps: accumrun accumulates itself; use training.subdivisions (got 4)"
    )
    # Nor is it offered among the arguments Adam takes.
    assert "gradient_accumulation_steps" not in message(name="adam", nesterov=True)


def test_a_value_the_optimizer_rejects() -> None:
    assert message(name="sgd", momentum=-1.0).startswith("optimizer: SGD rejected the settings: ")


# --- learning-rate schedules ----------------------------------------------------------------------------------

COSINE = {"name": "cosine_decay", "initial_learning_rate": 0.1, "decay_steps": 10}


def test_schedule_builds_and_starts_at_its_initial_rate() -> None:
    built = optimizer(name="sgd", learning_rate=dict(COSINE))
    schedule = built._learning_rate
    assert isinstance(schedule, keras.optimizers.schedules.CosineDecay)
    assert schedule.decay_steps == 10
    assert float(schedule(0)) == pytest.approx(0.1)
    assert float(schedule(10)) == pytest.approx(0.0, abs=1e-7)
    assert float(schedule(5)) == pytest.approx(0.05)
    # The optimizer reads the schedule at its own step, which is 0 before any update.
    assert int(built.iterations) == 0
    assert float(built.learning_rate) == pytest.approx(0.1)


def test_build_schedule_by_class_name() -> None:
    schedule = build_schedule(ScheduleConfig.model_validate({**COSINE, "name": "CosineDecay"}))
    assert float(schedule(0)) == pytest.approx(0.1)


def test_unknown_schedule_name() -> None:
    assert (
        message(name="sgd", learning_rate={**COSINE, "name": "cosine_dekay"})
        == "optimizer.learning_rate.name: unknown schedule; did you mean 'CosineDecay'? (got 'cosine_dekay')"
    )


def test_unknown_schedule_without_a_close_name_lists_them() -> None:
    assert message(name="sgd", learning_rate={"name": "zzzz"}) == (
        "optimizer.learning_rate.name: unknown schedule; known: CosineDecay, CosineDecayRestarts, ExponentialDecay, "
        "InverseTimeDecay, PiecewiseConstantDecay, PolynomialDecay (got 'zzzz')"
    )


def test_schedule_keyword_typo() -> None:
    assert message(name="sgd", learning_rate={"name": "cosine_decay", "initial_lr": 0.1, "decay_steps": 10}) == (
        "optimizer.learning_rate.initial_lr: CosineDecay has no such argument; "
        "did you mean 'initial_learning_rate'? (got 0.1)"
    )


def test_schedule_missing_a_required_argument() -> None:
    text = message(name="sgd", learning_rate={"name": "cosine_decay", "initial_learning_rate": 0.1})
    assert text.startswith("optimizer.learning_rate: CosineDecay rejected the settings: ")
    assert "decay_steps" in text


@pytest.mark.slow
def test_mlp_without_hidden_layers_is_linear_regression(tmp_path: Path) -> None:
    """``mlp`` with ``hidden: []`` is one Dense layer: full-batch gradient descent on it reaches the least-squares
    solution."""
    from accumrun import train

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = (x @ np.array([[1.5], [-2.0], [0.5]]) + 0.3 + 0.1 * rng.normal(size=(40, 1))).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    config = {
        "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "validation_split": 0.0},
        "model": {"name": "mlp", "hidden": []},
        "loss": {"name": "mean_squared_error"},
        "training": {"epochs": 300, "batch_size": "full", "subdivisions": 3},
        "optimizer": {"name": "sgd", "learning_rate": 0.3},
        "output": {"tensorboard": False},
    }
    result = train(config, tmp_path / "run", quiet=True)
    assert [type(layer).__name__ for layer in result.model.layers][-2:] == ["Flatten", "Dense"]
    kernel, bias = (v.numpy() for v in result.model.layers[-1].weights)
    solution, *_ = np.linalg.lstsq(np.hstack([x, np.ones((40, 1))]), y, rcond=None)
    np.testing.assert_allclose(np.append(kernel, bias), solution.ravel(), atol=1e-4)
