"""The model registry: how a ``model.name`` selects its kind, that the config's union is the table's, what the kinds
declare, and that loading a config imports no TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from accumrun.config.schema import Config
from accumrun.errors import ConfigError
from accumrun.models.registry import MODEL_SECTIONS, MODELS, UNKNOWN_MODEL, kind_of, model_tag


@pytest.mark.parametrize(
    ("model", "tag"),
    [
        ({}, "darknet_cnn"),
        ({"name": "darknet_cnn"}, "darknet_cnn"),
        ({"name": "mlp"}, "mlp"),
        ({"name": "transformer"}, "transformer"),
        ({"name": "keras.applications.MobileNetV2"}, "application"),
        ({"name": "keras.applications.MobileNetV2:build"}, "application"),
        ({"name": "keras_hub.models.GPT2Backbone"}, "keras_hub"),
        ({"name": "saved"}, "saved"),
        ({"name": "saved:build"}, "custom"),
        ({"name": "my_package.nets:build"}, "custom"),
        ({"name": "resnet"}, "unknown"),
        ({"name": "Mlp"}, "unknown"),
        ({"name": 3}, "unknown"),
        ({"name": None}, "unknown"),
    ],
)
def test_a_name_selects_its_kind(model: dict[str, Any], tag: str) -> None:
    assert model_tag(model) == tag


def test_every_kind_is_a_member_of_the_config_union_and_its_entry_answers_for_it() -> None:
    examples = {
        "darknet_cnn": {},
        "mlp": {"name": "mlp"},
        "transformer": {"name": "transformer"},
        "application": {"name": "keras.applications.MobileNetV2"},
        "keras_hub": {"name": "keras_hub.models.GPT2Backbone"},
        "saved": {"name": "saved", "path": "model.keras"},
        "custom": {"name": "my_package.nets:build"},
    }
    assert list(examples) == list(MODELS)
    for tag, model in examples.items():
        section = Config.model_validate({"model": model}).model
        assert type(section) is MODEL_SECTIONS[tag]
        assert kind_of(section) is MODELS[tag]
        assert model_tag(section) == tag


def test_the_refusal_of_an_unknown_name_lists_every_kind_in_the_table_order() -> None:
    assert UNKNOWN_MODEL == (
        "unknown model; use darknet_cnn, mlp, transformer, keras.applications.<Name>, "
        "keras_hub.models.<Name>Backbone, saved or 'package.module:function'"
    )
    with pytest.raises(ConfigError, match=r"^model.name: unknown model \(got 'x'\)$"):
        kind_of(SimpleNamespace(name="x"))


def test_what_the_kinds_declare() -> None:
    assert {tag for tag, kind in MODELS.items() if kind.token_ids} == {"transformer", "keras_hub"}
    assert {tag: kind.attention for tag, kind in MODELS.items() if kind.attention is not False} == {
        "transformer": True,
        "keras_hub": None,
        "saved": None,
        "custom": None,
    }
    # Only a pretrained application has a preprocessing of its own; the others have none.
    random = Config.model_validate({"model": {"name": "keras.applications.MobileNetV2"}}).model
    assert MODELS["application"].preprocessing(random) is None
    assert MODELS["mlp"].preprocessing(Config.model_validate({"model": {"name": "mlp"}}).model) is None


def test_each_kind_declares_its_own_cross_field_rules() -> None:
    darknet = Config.model_validate({"model": {"filters": [8, 16], "strides": [1]}}).model
    assert list(darknet.broken_rules()) == [("model.strides", "needs one stride per entry of model.filters (2)", [1])]
    frozen_top = {"name": "keras.applications.MobileNetV2", "include_top": True, "freeze_base": True}
    assert [key for key, _, _ in Config.model_validate({"model": frozen_top}).model.broken_rules()] == [
        "model.freeze_base"
    ]
    assert list(Config.model_validate({"model": {"name": "mlp"}}).model.broken_rules()) == []


@pytest.mark.subprocess
def test_loading_a_config_of_every_kind_imports_no_tensorflow(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from accumrun.config.loading import load_config\n"
        "from accumrun.models.registry import MODELS\n"
        "for name in ('mlp', 'transformer', 'keras.applications.MobileNetV2', 'keras_hub.models.GPT2Backbone',\n"
        "             'my_package.nets:build'):\n"
        "    load_config({'model': {'name': name}})\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'tensorflow loaded'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
