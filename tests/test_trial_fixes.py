"""The second newcomer's trial, the smaller findings (issue 49, item 5): optimizer names without regard to case,
one word for a list, ``--set`` mappings that merge, the printed token config that can generate, errors that blame
what the user typed (the tokenizer's for `generate` is in test_tokens), and example data that git ignores."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from accumrun import load_config
from accumrun.data.dataset import load_dataset
from accumrun.data.examples import make_example, write_random_labels
from accumrun.errors import ConfigError, DataError
from accumrun.kinds import Measure, Split
from accumrun.optim.optimizers import build_optimizer
from accumrun.reports.evaluate import _split as scored_split
from accumrun.rundir.metrics import EpochRow
from accumrun.training.console import epoch_line

FULL_BATCH = {"data": {"name": "digits"}, "training": {"batch_size": "full", "subdivisions": 1}}
README = Path(__file__).parent.parent / "README.md"


@pytest.mark.parametrize("spelling", ["lbfgs", "LBFGS", "L_BFGS", "Lbfgs"])
def test_lbfgs_is_named_without_regard_to_case_as_keras_optimizers_are(spelling: str) -> None:
    config = load_config({**FULL_BATCH, "optimizer": {"name": spelling, "history": 4}})
    assert config.optimizer.name == "lbfgs" and config.optimizer.kind.full_batch


def test_an_unknown_optimizer_lists_lbfgs_and_lbfgs_offers_only_the_keys_it_takes() -> None:
    config = load_config({"data": {"name": "digits"}, "optimizer": {"name": "zzzzqq"}})
    with pytest.raises(ConfigError, match=r"^optimizer\.name: unknown optimizer; known: .*, lbfgs \(got 'zzzzqq'\)$"):
        build_optimizer(config.optimizer)
    with pytest.raises(ConfigError) as error:
        load_config({**FULL_BATCH, "optimizer": {"name": "lbfgs", "histroy": 3}})
    assert "did you mean 'history'" in error.value.format_message()
    with pytest.raises(ConfigError) as error:
        load_config({**FULL_BATCH, "optimizer": {"name": "lbfgs", "momentum": 0.9}})
    known = error.value.format_message().partition("known keys: ")[2].split(", ")
    assert "history" in known and not {"clipnorm", "global_clipnorm", "clipvalue", "weight_decay"} & set(known)


def test_one_word_or_number_where_a_list_is_expected_is_a_list_of_one() -> None:
    config = load_config(
        {"data": {"name": "digits"}, "model": {"name": "mlp"}},
        ["training.measure=noise_scale", "metrics=accuracy", "model.hidden=32"],
    )
    assert config.training.measure == [Measure.NOISE_SCALE]
    assert config.metrics == ["accuracy"] and config.model.hidden == [32]


def test_a_mapping_given_with_set_merges_into_its_section_as_deeper_keys_would() -> None:
    source = {"data": {"name": "text_corpus", "path": "corpus", "sequence_length": 64, "stride": 32}}
    merged = load_config(source, ["data={validation_split: 0.25, stride: 16}"])
    deeper = load_config(source, ["data.validation_split=0.25", "data.stride=16"])
    assert merged == deeper and merged.data.sequence_length == 64 and merged.data.stride == 16
    other_kind = load_config(source, ["data={name: npz, path: digits.npz}"])
    assert other_kind.data.name == "npz" and other_kind.data.path == "digits.npz"
    stopping = {"monitor": "val_loss", "patience": 5, "min_delta": 0.01}
    nested = load_config(
        {**source, "training": {"early_stopping": stopping}}, ["training={early_stopping: {patience: 2}}"]
    )
    assert nested.training.early_stopping is not None
    assert (nested.training.early_stopping.patience, nested.training.early_stopping.min_delta) == (2, 0.01)


def test_the_token_config_that_make_example_prints_trains_a_model_that_can_generate(tmp_path: Path) -> None:
    lines = make_example("tokens", tmp_path / "tokens", 20, 32, 0)
    printed = yaml.safe_load(lines[-1].partition("train on them with data: ")[2])
    assert printed["tokenizer"] == {"name": "byte"}
    data = dict(printed, sequence_length=16)
    assert load_dataset(load_config({"data": data}).data, seed=0).vocabulary_size == 257


def test_a_missing_evaluate_data_file_is_blamed_on_the_data_option(tmp_path: Path) -> None:
    labels = write_random_labels(tmp_path / "labels.npz", Path("datasets/digits.npz"))
    config = load_config({"data": {"name": "npz", "path": str(labels)}})
    with pytest.raises(DataError, match=r"^--data: "):
        scored_split(config, None, Split.VAL, str(tmp_path / "missing.npz"), np.float32)  # type: ignore[arg-type]


def test_every_example_target_the_readme_makes_is_ignored_by_git() -> None:
    root = README.parent
    targets = sorted(set(re.findall(r"make-example [a-z-]+ (datasets/[\w./-]+)", README.read_text())))
    assert "datasets/random_labels.npz" in targets
    ignored = subprocess.run(["git", "check-ignore", *targets], cwd=root, capture_output=True, text=True)
    assert sorted(ignored.stdout.split()) == targets
    assert np.load(root / "datasets/digits.npz")["x"].shape[0] > 0  # the bundled data is not among them


def test_a_measured_epoch_row_keeps_training_time_and_measuring_time_apart() -> None:
    row = EpochRow(epoch=2, loss=0.5, seconds=3.7, measure_seconds=3.6, samples_per_second=18_000.0)
    assert epoch_line(row, 5, []) == "epoch 2/5 | loss 0.5000 | 0.1 s | 18,000 samples/s | measured in 3.6 s"
    assert EpochRow.from_json(row.to_json()) == row
    unmeasured = EpochRow(epoch=1, loss=0.5, seconds=0.1, samples_per_second=18_000.0)
    assert "measure_seconds" not in unmeasured.to_json() and epoch_line(unmeasured, 5, []).endswith(
        "| 0.1 s | 18,000 samples/s"
    )
