"""The cross-field rules that each section or feature declares in its own module, collected by the config in turn:
every message, key path and the order in which one config that breaks them all lists them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from accumrun.config.loading import load_config
from accumrun.errors import ConfigError

BREAKS_EVERY_RULE = {
    "training": {"batch_size": 4, "subdivisions": 8, "class_weight": "balanced", "precision": "mixed_float16"},
    "data": {
        "name": "csv",
        "path": "train.csv",
        "validation_path": "val.csv",
        "validation_split": 0.2,
        "label": "y",
        "weight": "y",
        "feed": "sub_batch",
    },
    "distribute": {"strategy": "multi_worker", "logical_cpus": 2},
}


def test_each_feature_declares_its_rules_and_the_config_lists_them_in_turn() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BREAKS_EVERY_RULE)
    assert info.value.problems == [
        "training.subdivisions: cannot exceed training.batch_size (4); each sub-batch needs a sample (got 8)",
        "data.validation_split: cannot be set with data.validation_path; use one (got 0.2)",
        "training.class_weight: cannot be set with data.weight; multiply the class weights into the weight column "
        "or array (got 'balanced')",
        "data.weight: must be a column of its own, not the label or id column (got 'y')",
        "data.feed: sub_batch streams on one device, not with distribute.strategy: multi_worker (got 'sub_batch')",
        "distribute.logical_cpus: splits the CPU into replicas for distribute.strategy: mirrored, not multi_worker "
        "(got 2)",
        "training.precision: mixed_float16 (loss scaling) runs on one device only; use mixed_bfloat16 with distribute "
        "(got 'mixed_float16')",
    ]


def test_a_validation_split_of_zero_beside_a_validation_file_is_what_a_run_writes_back() -> None:
    config = load_config({"data": {"name": "csv", "path": "t.csv", "validation_path": "v.csv", "label": "y"}})
    assert load_config(yaml.safe_load(config.to_yaml())).data.validation_split == 0.0


def test_the_rule_modules_import_no_tensorflow() -> None:
    modules = ["distribute", "loss", "output", "precision", "schema"]
    code = "; ".join(f"import accumrun.config.{module}" for module in modules)
    code += "; import sys; print(sorted({'tensorflow', 'keras'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
