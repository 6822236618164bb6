"""load_config: defaults, unknown keys, types and ranges, cross-field rules, --set overrides and YAML problems."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from accumrun.config.loading import load_config
from accumrun.config.schema import (
    Config,
    OptimizerConfig,
    OutputConfig,
    TrainingConfig,
    data_config,
)
from accumrun.data.arrays import DigitsConfig
from accumrun.errors import ConfigError, ConfigProblems
from accumrun.kinds import BatchNormMode, Cluster, Direction, Feed, OnNonFinite, Precision, Strategy, Task
from accumrun.models.darknet_cnn import DarknetCnnConfig
from accumrun.models.factory import CustomModelConfig
from accumrun.models.mlp import MlpConfig

BATCH_SIZE_RULE = "must be a positive integer or 'full' (the whole training set)"
SPLIT_RULE = "must be a fraction in [0, 1) or 'test' (the dataset's test split)"


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path, overrides: list[str] = ()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value


def message_of(path: Path, overrides: list[str] = ()) -> str:
    return str(error_of(path, overrides))


# --- defaults -------------------------------------------------------------------------------------------------


def test_empty_file_gives_the_documented_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert config.seed == 0
    assert config.data.name == "digits"
    assert config.data.path is None
    assert config.data.validation_split == 0.1
    assert config.data.shuffle is True
    assert isinstance(config.model, DarknetCnnConfig)
    assert config.model.name == "darknet_cnn"
    assert config.model.filters == [32, 64, 96]
    assert config.model.strides == [2, 2, 1]
    assert config.model.leaky_alpha == 0.1
    assert config.training.epochs == 10
    assert config.training.batch_size == 256
    assert config.training.subdivisions == 1
    assert config.training.drop_remainder is False
    assert config.optimizer.name == "adam"
    assert config.optimizer.learning_rate == 0.001
    assert config.optimizer.keywords == {}
    assert config.output.run_dir == "runs/{config_name}-{timestamp}"
    assert config.distribute.strategy == "none"
    assert config.distribute.logical_cpus is None


def test_empty_file_equals_the_schema_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == Config()


def test_empty_sections_keep_their_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "data: {}\ntraining: {}\noptimizer: {}\noutput: {}\n"))
    assert config.data == DigitsConfig()
    assert config.training == TrainingConfig()
    assert config.optimizer == OptimizerConfig()
    assert config.output == OutputConfig()


def test_a_partial_section_keeps_the_other_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "training:\n  batch_size: 64\n"))
    assert config.training.batch_size == 64
    assert config.training.epochs == 10
    assert config.training.subdivisions == 1


# --- unknown keys ---------------------------------------------------------------------------------------------


def test_unknown_top_level_key_suggests_the_close_one(tmp_path: Path) -> None:
    assert message_of(write(tmp_path, "trainig:\n  epochs: 2\n")) == "trainig: unknown key (did you mean 'training'?)"


def test_unknown_top_level_key_without_a_close_match_lists_the_known_keys(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "zzz: 1\n"))
        == "zzz: unknown key; known keys: seed, data, model, loss, metrics, training, optimizer, output, distribute"
    )


def test_unknown_nested_key_names_its_full_path(tmp_path: Path) -> None:
    message = message_of(write(tmp_path, "training:\n  subdivsions: 4\n"))
    assert "training.subdivsions: unknown key (did you mean 'subdivisions'?)" in message
    assert message == "training.subdivsions: unknown key (did you mean 'subdivisions'?)"


def test_unknown_key_in_darknet_model_has_no_union_tag_in_its_path(tmp_path: Path) -> None:
    message = message_of(write(tmp_path, "model:\n  filtres: [8, 16, 32]\n"))
    assert message == "model.filtres: unknown key (did you mean 'filters'?)"
    assert "darknet_cnn" not in message


def test_unknown_key_in_mlp_model_is_checked_against_the_mlp_keys(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "model:\n  name: mlp\n  hiden: [8]\n"))
        == "model.hiden: unknown key (did you mean 'hidden'?)"
    )


def test_darknet_only_key_in_mlp_lists_the_mlp_keys(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "model:\n  name: mlp\n  filters: [8]\n"))
        == "model.filters: unknown key; known keys: name, lora, quantize, adapters, hidden, activation, dropout, l2"
    )


def test_unknown_optimizer_keys_are_left_for_build_time(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "optimizer:\n  name: sgd\n  momentum: 0.9\n"))
    assert config.optimizer.keywords == {"momentum": 0.9}


# --- types and ranges -----------------------------------------------------------------------------------------


def test_wrong_type_names_key_and_value(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "training:\n  epochs: ten\n"))
        == "training.epochs: input should be a valid integer (got 'ten')"
    )


def test_a_boolean_is_not_an_integer(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "training:\n  epochs: true\n"))
        == "training.epochs: input should be a valid integer (got True)"
    )


def test_zero_subdivisions_is_out_of_range(tmp_path: Path) -> None:
    message = message_of(write(tmp_path, "training:\n  subdivisions: 0\n"))
    assert "training.subdivisions" in message
    assert "(got 0)" in message
    assert (
        message
        == "training.subdivisions: must be a positive integer or 'auto' (find the fewest that fit in memory) (got 0)"
    )


def test_misspelled_full_batch_size_mentions_full(tmp_path: Path) -> None:
    message = message_of(write(tmp_path, "training:\n  batch_size: ful\n"))
    assert "'full'" in message
    assert message == f"training.batch_size: {BATCH_SIZE_RULE} (got 'ful')"


@pytest.mark.parametrize("value", ["0", "-4", "2.5", "true"])
def test_batch_size_must_be_a_positive_integer(tmp_path: Path, value: str) -> None:
    message = message_of(write(tmp_path, f"training:\n  batch_size: {value}\n"))
    assert message.startswith(f"training.batch_size: {BATCH_SIZE_RULE} (got ")


def test_batch_size_full_is_accepted(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "training:\n  batch_size: full\n")).training.batch_size == "full"


def test_negative_learning_rate_is_refused(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "optimizer:\n  learning_rate: -0.5\n"))
        == "optimizer.learning_rate: must be a positive number or a schedule mapping with a 'name' (got -0.5)"
    )


def test_zero_learning_rate_is_refused(tmp_path: Path) -> None:
    assert message_of(write(tmp_path, "optimizer:\n  learning_rate: 0\n")).startswith(
        "optimizer.learning_rate: must be a positive number"
    )


def test_integer_learning_rate_becomes_a_float(tmp_path: Path) -> None:
    learning_rate = load_config(write(tmp_path, "optimizer:\n  learning_rate: 1\n")).optimizer.learning_rate
    assert learning_rate == 1.0
    assert isinstance(learning_rate, float)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1e-3", 0.001), ("5E-4", 0.0005), ("2e+2", 200.0), ("1.5e-3", 0.0015), ("3e2", 300.0)],
)
def test_exponent_notation_is_a_number_as_in_yaml_1_2(tmp_path: Path, text: str, expected: float) -> None:
    # PyYAML reads YAML 1.1, where "1e-3" (no dot, or no exponent sign) is a string, refused as "not a number".
    config = load_config(write(tmp_path, f"optimizer:\n  learning_rate: {text}\n  epsilon: {text}\n"))
    assert config.optimizer.learning_rate == expected
    assert config.optimizer.keywords == {"epsilon": expected}
    overridden = load_config(write(tmp_path, ""), [f"optimizer.learning_rate={text}"])
    assert overridden.optimizer.learning_rate == expected


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "Yes", "OFF"])
def test_yes_no_on_off_are_text_as_in_yaml_1_2(tmp_path: Path, word: str) -> None:
    # PyYAML reads YAML 1.1, where these are booleans: a class called `yes` became True and was refused.
    path = write(tmp_path, f"training:\n  class_weight: {{{word}: 4.0}}\n")
    assert load_config(path).training.class_weight == {word: 4.0}
    overridden = load_config(write(tmp_path, "", "empty.yaml"), [f"training.class_weight={{{word}: 2.0}}"])
    assert overridden.training.class_weight == {word: 2.0}


@pytest.mark.parametrize(("word", "expected"), [("yes", True), ("on", True), ("no", False), ("OFF", False)])
def test_boolean_keys_still_take_yes_no_on_off(tmp_path: Path, word: str, expected: bool) -> None:
    text = f"data:\n  shuffle: {word}\ntraining:\n  jit_compile: {word}\noutput:\n  tensorboard: {word}\n"
    config = load_config(write(tmp_path, text))
    assert (config.data.shuffle, config.training.jit_compile, config.output.tensorboard) == (expected,) * 3
    assert load_config(write(tmp_path, ""), [f"data.shuffle={word}"]).data.shuffle is expected
    if not expected:  # a key that takes false or a number
        assert load_config(write(tmp_path, ""), [f"data.rescale={word}"]).data.rescale is False


def test_a_word_that_names_no_boolean_is_refused_by_a_boolean_key(tmp_path: Path) -> None:
    assert message_of(write(tmp_path, "data:\n  shuffle: maybe\n")).startswith("data.shuffle: input should be")


def test_a_quoted_number_stays_text(tmp_path: Path) -> None:
    assert message_of(write(tmp_path, 'optimizer:\n  learning_rate: "1e-3"\n')).startswith(
        "optimizer.learning_rate: must be a positive number"
    )


def test_zero_epochs_is_refused(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "training:\n  epochs: 0\n"))
        == "training.epochs: input should be greater than or equal to 1 (got 0)"
    )


def test_validation_split_above_one_is_refused(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "data:\n  validation_split: 1.5\n"))
        == f"data.validation_split: {SPLIT_RULE} (got 1.5)"
    )


@pytest.mark.parametrize(("text", "expected"), [("0", 0.0), ("0.25", 0.25), ("test", "test")])
def test_validation_split_accepts_fractions_and_test(tmp_path: Path, text: str, expected: object) -> None:
    assert load_config(write(tmp_path, f"data:\n  validation_split: {text}\n")).data.validation_split == expected


def test_list_entries_are_named_by_index(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "model:\n  name: mlp\n  hidden: [8, 0]\n"))
        == "model.hidden[1]: input should be greater than or equal to 1 (got 0)"
    )


def test_all_problems_are_listed_in_one_error(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  epochs: 0\n  subdivisions: 0\ndata:\n  validation_split: 1.5\n")
    error = error_of(path)
    assert isinstance(error, ConfigProblems)
    assert error.problems == [
        f"data.validation_split: {SPLIT_RULE} (got 1.5)",
        "training.epochs: input should be greater than or equal to 1 (got 0)",
        "training.subdivisions: must be a positive integer or 'auto' (find the fewest that fit in memory) (got 0)",
    ]
    assert str(error) == "\n".join([f"3 problems in {path}:"] + [f"  {problem}" for problem in error.problems])


# --- cross-field rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("subdivisions", [5, 8])
def test_subdivisions_cannot_exceed_the_batch_size(tmp_path: Path, subdivisions: int) -> None:
    assert message_of(write(tmp_path, f"training:\n  batch_size: 4\n  subdivisions: {subdivisions}\n")) == (
        "training.subdivisions: cannot exceed training.batch_size (4); each sub-batch needs a sample "
        f"(got {subdivisions})"
    )


def test_subdivisions_equal_to_the_batch_size_are_fine(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "training:\n  batch_size: 4\n  subdivisions: 4\n")).training.subdivisions == 4


def test_subdivisions_with_full_batch_are_checked_later(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "training:\n  batch_size: full\n  subdivisions: 1000\n"))
    assert config.training.subdivisions == 1000


@pytest.mark.parametrize("strategy", ["none", "auto", "mirrored", "multi_worker"])
def test_distribute_strategies_are_accepted(tmp_path: Path, strategy: str) -> None:
    assert load_config(write(tmp_path, f"distribute:\n  strategy: {strategy}\n")).distribute.strategy == strategy


def test_unknown_distribute_strategy_lists_the_known_ones(tmp_path: Path) -> None:
    message = message_of(write(tmp_path, "distribute:\n  strategy: horovod\n"))
    assert message.startswith("distribute.strategy: ") and "'mirrored'" in message and "(got 'horovod')" in message


def test_logical_cpus_with_mirrored_is_fine(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), ["distribute.strategy=mirrored", "distribute.logical_cpus=2"])
    assert config.distribute.logical_cpus == 2


@pytest.mark.parametrize("strategy", ["none", "auto", "multi_worker"])
def test_logical_cpus_only_apply_to_mirrored(tmp_path: Path, strategy: str) -> None:
    assert message_of(write(tmp_path, f"distribute:\n  strategy: {strategy}\n  logical_cpus: 2\n")) == (
        f"distribute.logical_cpus: splits the CPU into replicas for distribute.strategy: mirrored, not {strategy} "
        "(got 2)"
    )


def test_zero_logical_cpus_is_out_of_range(tmp_path: Path) -> None:
    message = message_of(write(tmp_path, "distribute:\n  strategy: mirrored\n  logical_cpus: 0\n"))
    assert message.startswith("distribute.logical_cpus: ") and message.endswith("(got 0)")


def test_synthetic_only_key_with_digits_is_refused(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "data:\n  samples: 100\n"))
        == "data.samples: only applies to data.name: synthetic (got 100)"
    )


def test_synthetic_only_keys_are_refused_even_at_their_default(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "data:\n  name: mnist\n  classes: 10\n"))
        == "data.classes: only applies to data.name: synthetic (got 10)"
    )


def test_synthetic_keys_with_synthetic_data(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "data:\n  name: synthetic\n  samples: 30\n  shape: [4]\n  classes: 3\n"))
    assert (config.data.samples, config.data.shape, config.data.classes) == (30, [4], 3)


def test_npz_needs_a_path(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "data:\n  name: npz\n"))
        == "data.path: data.name: npz needs the path of an .npz file"
    )


def test_path_is_not_used_by_synthetic_data(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "data:\n  name: synthetic\n  path: x.npz\n"))
        == "data.path: is not used by data.name: synthetic (got 'x.npz')"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("name: image_folder\n  path: x", "data.image_size: data.name: image_folder needs [height, width] to resize"),
        ("name: tfrecord\n  image_size: [8, 8]", "data.path: data.name: tfrecord needs a TFRecord file or a glob"),
        ("name: csv\n  path: t.csv", "data.label: data.name: csv needs the name of the label column"),
        ("name: tfds\n  image_size: [8, 8]", "data.dataset: data.name: tfds needs the name of a prepared dataset"),
    ],
)
def test_a_source_names_the_key_it_needs(tmp_path: Path, data: str, message: str) -> None:
    assert message_of(write(tmp_path, f"data:\n  {data}\n")).startswith(message)


def test_unknown_data_name_lists_the_sources(tmp_path: Path) -> None:
    assert message_of(write(tmp_path, "data:\n  name: imagenet\n  image_size: [8, 8]\n")) == (
        "data.name: input should be 'digits', 'npz', 'mnist', 'fashion_mnist', 'synthetic', 'image_folder', "
        "'tfrecord', 'csv', 'tfds', 'text_folder', 'text_corpus', 'jsonl' or 'tokens' (got 'imagenet')"
    )


def test_a_validation_file_and_a_split_are_refused_together(tmp_path: Path) -> None:
    path = write(
        tmp_path, "data:\n  name: csv\n  path: a.csv\n  label: y\n  validation_path: b.csv\n  validation_split: 0.2\n"
    )
    assert message_of(path) == "data.validation_split: cannot be set with data.validation_path; use one (got 0.2)"


@pytest.mark.parametrize(
    "data",
    [
        {"name": "npz", "path": "d.npz"},
        {"name": "fashion_mnist"},
        {"name": "image_folder", "path": "images", "image_size": [8, 8], "color_mode": "grayscale"},
        {"name": "tfrecord", "path": "r-*", "image_size": [8, 8], "shuffle_buffer": 4},
        {"name": "csv", "path": "t.csv", "label": "y", "task": "regression"},
        {"name": "tfds", "dataset": "mnist", "image_size": [28, 28], "feed": "sub_batch"},
    ],
)
def test_each_source_writes_only_its_own_keys_and_loads_back(tmp_path: Path, data: dict[str, object]) -> None:
    config = load_config({"data": data})
    written = config.to_yaml()
    assert load_config(write(tmp_path, written)) == config
    assert set(yaml.safe_load(written)["data"]) == set(type(config.data).model_fields)


def test_closed_sets_parse_into_their_enums_and_are_written_as_words(tmp_path: Path) -> None:
    text = (
        "data:\n  task: multi_label\n  feed: batch\n"
        "training:\n  batch_norm: frozen\n  precision: mixed_bfloat16\n  on_nonfinite: skip_batch\n"
        "  early_stopping: {mode: max}\n"
        "distribute:\n  strategy: mirrored\n  cluster: slurm\n"
    )
    config = load_config(write(tmp_path, text))
    assert (config.data.task, config.data.feed) == (Task.MULTI_LABEL, Feed.BATCH)
    training = config.training
    assert (training.batch_norm, training.precision, training.on_nonfinite) == (
        BatchNormMode.FROZEN,
        Precision.MIXED_BFLOAT16,
        OnNonFinite.SKIP_BATCH,
    )
    assert training.early_stopping is not None and training.early_stopping.mode is Direction.MAX
    assert (config.distribute.strategy, config.distribute.cluster) == (Strategy.MIRRORED, Cluster.SLURM)
    written = yaml.safe_load(config.to_yaml())
    assert written["training"]["batch_norm"] == "frozen" and type(written["training"]["batch_norm"]) is str
    assert written["distribute"] == {**written["distribute"], "strategy": "mirrored", "cluster": "slurm"}
    assert load_config(write(tmp_path, config.to_yaml(), name="resolved.yaml")) == config


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("training.batch_norm", "'per_batch', 'sub_batch', 'precise' or 'frozen'"),
        ("data.task", "'auto', 'classification', 'binary', 'regression', 'multi_label' or 'causal_lm'"),
        ("data.feed", "'auto', 'batch' or 'sub_batch'"),
        ("training.precision", "'float32', 'mixed_float16', 'mixed_bfloat16' or 'float64'"),
        ("distribute.cluster", "'auto', 'tf_config' or 'slurm'"),
    ],
)
def test_a_word_outside_a_closed_set_lists_the_allowed_ones(tmp_path: Path, key: str, words: str) -> None:
    assert message_of(write(tmp_path, ""), [f"{key}=other"]) == f"{key}: input should be {words} (got 'other')"


def test_python_values_may_be_enum_members_or_their_words() -> None:
    assert TrainingConfig(batch_norm="precise") == TrainingConfig(batch_norm=BatchNormMode.PRECISE)
    assert data_config(name="image_folder", path="x", image_size=[4, 4], color_mode="grayscale").channels == 1


def test_darknet_needs_one_stride_per_filter(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "model:\n  filters: [8, 16]\n  strides: [1]\n"))
        == "model.strides: needs one stride per entry of model.filters (2) (got [1])"
    )


def test_unknown_model_name(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "model:\n  name: resnet\n"))
        == "model.name: unknown model; use darknet_cnn, mlp, transformer, keras.applications.<Name>, "
        "keras_hub.models.<Name>Backbone, saved or 'package.module:function' (got 'resnet')"
    )


def test_malformed_custom_model_name(tmp_path: Path) -> None:
    message = message_of(write(tmp_path, "model:\n  name: 'pkg.mod:'\n"))
    assert message.startswith("model.name: string should match pattern ")
    assert message.endswith("(got 'pkg.mod:')")


def test_schema_and_cross_field_problems_are_reported_in_turn(tmp_path: Path) -> None:
    # Cross-field rules only run on a config that passed the schema: first the typo, then the cross-field problem.
    path = write(tmp_path, "training:\n  batch_size: 4\n  subdivisions: 8\n  epoch: 3\n")
    assert message_of(path) == "training.epoch: unknown key (did you mean 'epochs'?)"
    path.write_text("training:\n  batch_size: 4\n  subdivisions: 8\nmodel:\n  filters: [8, 16]\n  strides: [1]\n")
    error = error_of(path)
    assert error.problems == [
        "training.subdivisions: cannot exceed training.batch_size (4); each sub-batch needs a sample (got 8)",
        "model.strides: needs one stride per entry of model.filters (2) (got [1])",
    ]
    assert str(error).startswith(f"2 problems in {path}:\n")


def test_a_key_of_another_source_is_refused_with_the_other_schema_problems(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  epoch: 3\ndata:\n  samples: 5\n  image_size: [8, 8]\n")
    assert error_of(path).problems == [
        "data.samples: only applies to data.name: synthetic (got 5)",
        "data.image_size: only applies to data.name: image_folder or tfrecord or tfds (got [8, 8])",
        "training.epoch: unknown key (did you mean 'epochs'?)",
    ]


# --- overrides ------------------------------------------------------------------------------------------------


def test_override_wins_over_the_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  subdivisions: 2\n")
    assert load_config(path, ["training.subdivisions=4"]).training.subdivisions == 4


def test_override_creates_a_missing_section(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), ["training.subdivisions=4"]).training.subdivisions == 4


def test_precedence_is_defaults_then_yaml_then_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  batch_size: 32\n  subdivisions: 2\n")
    training = load_config(path, ["training.subdivisions=4"]).training
    assert training.epochs == 10  # default
    assert training.batch_size == 32  # YAML
    assert training.subdivisions == 4  # override


def test_later_override_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert load_config(path, ["training.subdivisions=4", "training.subdivisions=8"]).training.subdivisions == 8


def test_overrides_are_yaml_typed(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, ""),
        ["training.batch_size=full", "model.filters=[8, 16]", "model.strides=[1, 2]", "data.shuffle=false"],
    )
    assert config.training.batch_size == "full"
    assert config.model.filters == [8, 16]
    assert config.model.strides == [1, 2]
    assert config.data.shuffle is False


def test_override_values_are_validated_like_yaml_values(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, ""), ["training.subdivisions=four"])
        == "training.subdivisions: must be a positive integer or 'auto' (find the fewest that fit in memory) "
        "(got 'four')"
    )


def test_overrides_pass_the_cross_field_rules(tmp_path: Path) -> None:
    # filters from --set, strides from the defaults: three strides for two filters.
    assert (
        message_of(write(tmp_path, ""), ["model.filters=[8, 16]"])
        == "model.strides: needs one stride per entry of model.filters (2) (got [2, 2, 1])"
    )


def test_override_can_switch_the_model(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "model:\n  name: darknet_cnn\n"), ["model.name=mlp"])
    assert config.model == MlpConfig(name="mlp")


@pytest.mark.parametrize("override", ["training", "=4", "training..x=1", ".x=1"])
def test_malformed_override_is_refused(tmp_path: Path, override: str) -> None:
    assert (
        message_of(write(tmp_path, ""), [override])
        == f"overrides: expected KEY=VALUE with a dotted key such as training.subdivisions=4 (got {override!r})"
    )


def test_override_through_a_non_section_is_refused(tmp_path: Path) -> None:
    assert (
        message_of(write(tmp_path, "seed: 3\n"), ["seed.x=1"])
        == "seed: is not a section, so --set seed.x cannot apply (got 3)"
    )


def test_override_through_a_defaulted_non_section_is_refused(tmp_path: Path) -> None:
    # seed is not in the file, so the override builds {'x': 1} in its place, which the schema then refuses.
    message = message_of(write(tmp_path, ""), ["seed.x=1"])
    assert message.startswith("seed: ")
    assert "(got {'x': 1})" in message


def test_overrides_do_not_touch_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  subdivisions: 2\n")
    load_config(path, ["training.subdivisions=4"])
    assert path.read_text() == "training:\n  subdivisions: 2\n"
    assert load_config(path).training.subdivisions == 2


# --- file problems --------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    assert message_of(path) == f"{path}: config file not found"


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    assert message_of(tmp_path) == f"{tmp_path}: config file not found"


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  epochs: 1\n   batch_size: 3\n")
    message = message_of(path)
    assert "invalid YAML" in message
    assert message == f"{path}: invalid YAML at line 3: mapping values are not allowed here"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "training:\n  epochs: 3\nseed: 1\ntraining:\n  batch_size: 32\n",
            "line 4: duplicate key 'training' (first at line 1)",
        ),
        ("training:\n  epochs: 3\n  epochs: 5\n", "line 3: duplicate key 'epochs' (first at line 2)"),
    ],
)
def test_a_key_written_twice_is_refused_not_dropped(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert message_of(path) == f"{path}: invalid YAML at {expected}"
    # A merge may repeat what it merges: the key written after it wins, as YAML says.
    merged = write(tmp_path, "base: &base {epochs: 3, batch_size: 8}\ntraining:\n  <<: *base\n  epochs: 5\n")
    assert message_of(merged).startswith("base: unknown key")  # the merge itself passed


def test_a_set_value_meant_as_a_list_that_is_not_yaml_says_so(tmp_path: Path) -> None:
    assert message_of(write(tmp_path, ""), ["model.filters=[8,16"]) == (
        "model.filters: invalid YAML: expected ',' or ']', but got '<stream end>' (got '[8,16')"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model: darknet_cnn", "model: must be a mapping of keys such as {name: darknet_cnn} (got 'darknet_cnn')"),
        ("loss: mse", "loss: must be a mapping of keys such as {name: mse} (got 'mse')"),
        (
            "data: {name: text_corpus, path: x, tokenizer: byte}",
            "data.tokenizer: must be a mapping of keys such as {name: byte} (got 'byte')",
        ),
        ("training: 5", "training: must be a mapping of keys (got 5)"),
    ],
)
def test_a_section_written_as_one_value_is_asked_for_as_a_mapping(tmp_path: Path, text: str, expected: str) -> None:
    assert message_of(write(tmp_path, text + "\n")) == expected


def test_top_level_list_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "- 1\n- 2\n")
    assert message_of(path) == f"{path}: the top level must be a mapping of sections (got 'list')"


def test_top_level_scalar_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "hello\n")
    assert message_of(path) == f"{path}: the top level must be a mapping of sections (got 'str')"


def test_load_config_accepts_a_str_path(tmp_path: Path) -> None:
    assert load_config(str(write(tmp_path, "seed: 5\n"))).seed == 5


# --- custom models and round trips ----------------------------------------------------------------------------


def test_custom_model_keeps_its_extra_keys(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "model:\n  name: pkg.mod:fn\n  width: 3\n  depths: [1, 2]\n"))
    assert isinstance(config.model, CustomModelConfig)
    assert config.model.name == "pkg.mod:fn"
    assert config.model.model_extra == {"width": 3, "depths": [1, 2]}


def test_to_yaml_round_trips_a_synthetic_custom_config(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            "seed: 7\n"
            "data:\n  name: synthetic\n  samples: 30\n  shape: [4]\n  classes: 3\n  validation_split: 0.2\n"
            "model:\n  name: pkg.mod:fn\n  width: 3\n"
            "training:\n  batch_size: 10\n  subdivisions: 3\n  drop_remainder: true\n"
            "optimizer:\n  name: sgd\n  momentum: 0.9\n"
            "  learning_rate: {name: cosine_decay, initial_learning_rate: 0.1, decay_steps: 10}\n",
        )
    )
    again = load_config(write(tmp_path, config.to_yaml(), name="resolved.yaml"))
    assert again == config
    assert again.to_yaml() == config.to_yaml()
    assert again.model.model_extra == {"width": 3}
    assert again.optimizer.keywords == {"momentum": 0.9}


def test_to_yaml_round_trips_an_mlp_config_with_overrides(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "data:\n  name: synthetic\nmodel:\n  name: mlp\n  dropout: 0.25\n"),
        ["training.batch_size=full", "optimizer.learning_rate=0.01"],
    )
    again = load_config(write(tmp_path, config.to_yaml(), name="resolved.yaml"))
    assert again == config


def test_to_yaml_round_trips_the_default_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert load_config(write(tmp_path, config.to_yaml(), name="resolved.yaml")) == config


def test_schedule_without_a_name_names_the_missing_key(tmp_path: Path) -> None:
    path = write(tmp_path, "optimizer:\n  learning_rate:\n    initial_learning_rate: 0.1\n")
    assert message_of(path) == "optimizer.learning_rate.name: required key is missing"
