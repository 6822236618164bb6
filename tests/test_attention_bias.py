"""``model.attention_bias``: the built-in transformer's attention has no biases unless asked, and a run from before
the key (whose config.yaml lacks it) had them, and resumes with them."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import pytest
import yaml

from accumrun import load_config, train
from accumrun.config.loading import load_resume_config
from accumrun.errors import ConfigError
from accumrun.models.transformer import transformer
from tests.helpers import write_config
from tests.test_lm import lm_config

PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")


def biases(model: keras.Model) -> list[bool]:
    """Whether each attention projection of each block has a bias."""
    layers = [layer for layer in model.layers if isinstance(layer, keras.layers.MultiHeadAttention)]
    return [getattr(layer, name).bias is not None for layer in layers for name in PROJECTIONS]


def test_a_new_transformer_has_no_attention_bias_and_its_run_records_that() -> None:
    model = transformer((16,), 257, 257, layers=2, heads=2, width=8, dropout=0.0, causal=True)
    assert biases(model) == [False] * 8
    with_bias = transformer((16,), 257, 257, layers=1, heads=2, width=8, dropout=0.0, causal=True, attention_bias=True)
    assert biases(with_bias) == [True] * 4
    config = load_config({"data": {"name": "text_corpus", "path": "x"}, "model": {"name": "transformer"}})
    assert yaml.safe_load(config.to_yaml())["model"]["attention_bias"] is False


@pytest.mark.slow
def test_a_run_from_before_the_key_keeps_its_attention_bias_on_resume(tmp_path: Path) -> None:
    # The run as accumrun made it before the key: attention with biases, and a config.yaml without the key.
    config = lm_config(tmp_path)
    config["model"] = {"name": "transformer", "layers": 1, "heads": 2, "width": 16, "attention_bias": True}
    train(config, tmp_path / "run", quiet=True)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    del saved["model"]["attention_bias"]
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    del config["model"]["attention_bias"]
    original = write_config(tmp_path / "original.yaml", **config)

    # From its own config.yaml, or from the original file (which never named the key): the biases it trained with.
    for config_path in (None, original):
        resumed = load_resume_config(tmp_path / "run", config_path, ["training.epochs=2"])
        assert resumed.model.attention_bias is True  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"model\.attention_bias \(True -> False\)"):
        load_resume_config(tmp_path / "run", None, ["training.epochs=2", "model.attention_bias=false"])

    # The checkpoint's biases restore into the rebuilt model (a model without them would not take them).
    result = train(resumed, tmp_path / "run", quiet=True, resume=True)
    assert biases(result.model) == [True] * 4
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["epoch"] for row in rows] == [1, 2]
